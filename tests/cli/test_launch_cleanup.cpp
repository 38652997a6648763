// SIGKILL to `lazytrain launch`: its ranks notice (they get SIGTERM when the launcher dies) and end, and
// the rendezvous directory the launcher could not remove is removed by the next launch, which leaves
// nothing behind itself; the directory of a launch still running (or of ranks still alive) is kept.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_process.h"
#include "core/timer.h"

namespace fs = std::filesystem;
using lt::testing::finish_process;
using lt::testing::start_lazytrain;

namespace {

std::vector<fs::path> rendezvous_dirs(const fs::path& tmp) {
  std::vector<fs::path> v;
  for (const auto& e : fs::directory_iterator(tmp))
    if (e.path().filename().string().rfind("lt-rdzv-", 0) == 0) v.push_back(e.path());
  return v;
}

// Whether the process is gone (or a zombie nobody reaps yet).
bool gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

pid_t read_pid(const fs::path& p) {
  std::ifstream in(p);
  pid_t pid = 0;
  in >> pid;
  return pid;
}

// Runs `lazytrain launch` with TMPDIR=tmp (the default rendezvous directory's parent).
pid_t start_launch(const fs::path& tmp, const std::vector<std::string>& args, const fs::path& log) {
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old ? old : "";
  ::setenv("TMPDIR", tmp.c_str(), 1);
  const pid_t pid = start_lazytrain(args, log);
  if (old) ::setenv("TMPDIR", saved.c_str(), 1);
  else ::unsetenv("TMPDIR");
  return pid;
}

int exit_code(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

TEST(LaunchRendezvousCleanup, SigkillToTheLauncherLeavesNoRendezvousDirectoryBehind) {
  const fs::path dir = fs::temp_directory_path() / ("lt_rdzv_cleanup_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const fs::path tmp = dir / "tmp";
  fs::create_directories(tmp);
  // Two ranks that write their pid and sleep.
  const std::string rank = "echo $$ > " + dir.string() + "/rank$LT_RANK; exec sleep 60";
  const pid_t launcher = start_launch(tmp, {"launch", "-n", "2", "--program", "--", "/bin/sh", "-c", rank}, dir / "log");
  const double t0 = lt::now_seconds();
  while ((!fs::exists(dir / "rank0") || !fs::exists(dir / "rank1")) && lt::now_seconds() - t0 < 20)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the pids are written
  const pid_t r0 = read_pid(dir / "rank0"), r1 = read_pid(dir / "rank1");
  ASSERT_GT(r0, 0);
  ASSERT_GT(r1, 0);
  ASSERT_EQ(rendezvous_dirs(tmp).size(), 1u);

  // A second launch while the first runs leaves the first's directory alone.
  EXPECT_EQ(exit_code(finish_process(start_launch(tmp, {"launch", "-n", "1", "--program", "--", "/bin/true"}, dir / "log"))), 0);
  EXPECT_EQ(rendezvous_dirs(tmp).size(), 1u);

  ::kill(launcher, SIGKILL);
  finish_process(launcher);
  // The ranks notice the launcher's death and end.
  const double t1 = lt::now_seconds();
  while (!(gone(r0) && gone(r1)) && lt::now_seconds() - t1 < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(gone(r0) && gone(r1)) << "ranks still running after the launcher was killed";

  // The next launch removes the dead launch's directory, and its own at its end.
  EXPECT_EQ(exit_code(finish_process(start_launch(tmp, {"launch", "-n", "2", "--program", "--", "/bin/true"}, dir / "log"))), 0);
  const auto left = rendezvous_dirs(tmp);
  EXPECT_TRUE(left.empty()) << "left behind: " << (left.empty() ? "" : left[0].string());
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

}  // namespace
