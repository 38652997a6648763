// Test helpers: the lazytrain binary as a child process (LT_LAZYTRAIN: the binary this build made;
// LT_BIN overrides it), and the "train" records of a run's metrics.jsonl.
#pragma once
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace lt::testing {

inline std::string lazytrain_binary() {
  const char* env = std::getenv("LT_BIN");
  return env && *env ? env : LT_LAZYTRAIN;
}

// Starts lazytrain with the arguments; returns its pid (stdout and stderr appended to log).
inline pid_t start_lazytrain(const std::vector<std::string>& args, const std::filesystem::path& log) {
  std::vector<std::string> all = {lazytrain_binary()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

// Waits for the process; returns its wait status.
inline int finish_process(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

// The "train" records of output_dir/metrics.jsonl, every one in file order (a line cut by a kill is skipped).
inline std::vector<nlohmann::json> train_records(const std::filesystem::path& out) {
  std::vector<nlohmann::json> v;
  std::ifstream f(out / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("type", "") == "train") v.push_back(std::move(j));
  }
  return v;
}

}  // namespace lt::testing
