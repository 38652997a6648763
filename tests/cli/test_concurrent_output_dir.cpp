// Two trainings into one output_dir at once: the second fails at once naming the first (pid, host, start
// time, command), whether it is `lazytrain train` or `lazytrain launch -n 2 -- train` (rank 0 holds the
// lock, the other rank does not wait forever), and the first run goes on untouched.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../common/repo_path.h"
#include "cli_process.h"
#include "core/timer.h"
#include "train/checkpoint_dir.h"

namespace fs = std::filesystem;
using lt::testing::finish_process;
using lt::testing::start_lazytrain;
using lt::testing::train_records;

namespace {

fs::path write_config(const fs::path& dir) {
  const fs::path cfg = dir / "lock.yaml";
  std::ofstream(cfg) << "model_name_or_path: tiny-qwen2\n"
                     << "tokenizer: " << (lt::testing::repo_root() / "configs" / "demo").string() << "\n"
                     << "template: chatml\ndataset: builtin:math\nmax_samples: 64\ncutoff_len: 64\n"
                     << "per_device_train_batch_size: 2\ngradient_accumulation_steps: 1\n"
                     << "learning_rate: 2.0e-3\nwarmup_steps: 1\nlogging_steps: 1\n"
                     << "progress_bar: false\nthreads: 1\nbackend: cpu\n";
  return cfg;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int exit_code(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

// Runs lazytrain; kills it after limit_s. Returns its exit code; *seconds: how long it ran.
int run_bounded(const std::vector<std::string>& args, const fs::path& log, double limit_s, double* seconds) {
  const double t0 = lt::now_seconds();
  const pid_t pid = start_lazytrain(args, log);
  int st = 0;
  while (::waitpid(pid, &st, WNOHANG) == 0) {
    if (lt::now_seconds() - t0 > limit_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  *seconds = lt::now_seconds() - t0;
  return exit_code(st);
}

TEST(ConcurrentOutputDir, SecondTrainingFailsAtOnceNamingTheHolder) {
  const fs::path dir = fs::temp_directory_path() / ("lt_concurrent_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string cfg = write_config(dir).string();
  const fs::path out = dir / "out";
  // The first run: long, no periodic checkpoint (nothing in output_dir tells a second run it is in use
  // but the lock).
  const pid_t first = start_lazytrain({"train", cfg, "output_dir=" + out.string(), "max_steps=100000", "save_steps=0"},
                                      dir / "first.log");
  const double t0 = lt::now_seconds();
  while (train_records(out).size() < 2 && lt::now_seconds() - t0 < 60)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(train_records(out).size(), 2u) << slurp(dir / "first.log");

  struct Case {
    const char* name;
    std::vector<std::string> args;
  };
  const std::vector<Case> cases = {
      {"train", {"train", cfg, "output_dir=" + out.string(), "max_steps=3"}},
      {"launch -n 2", {"launch", "-n", "2", "--grace", "5", "--", "train", cfg, "output_dir=" + out.string(), "max_steps=3"}},
      {"train, resume auto", {"train", cfg, "output_dir=" + out.string(), "max_steps=3", "resume_from_checkpoint=auto"}},
  };
  for (const auto& c : cases) {
    const fs::path log = dir / "second.log";
    fs::remove(log);
    double s = 0;
    const int rc = run_bounded(c.args, log, 60, &s);
    const std::string text = slurp(log);
    EXPECT_TRUE(rc == 1 || rc == 2) << c.name << ": rc " << rc << "\n" << text;
    EXPECT_LT(s, 30.0) << c.name << "\n" << text;
    EXPECT_NE(text.find("in use by another training run"), std::string::npos) << c.name << "\n" << text;
    EXPECT_NE(text.find("pid " + std::to_string(first)), std::string::npos) << c.name << "\n" << text;
    EXPECT_NE(text.find("started "), std::string::npos) << c.name << "\n" << text;
    EXPECT_NE(text.find(" train " + cfg), std::string::npos) << c.name << ": the holder's command\n" << text;
    EXPECT_EQ(text.find("internal error"), std::string::npos) << c.name << "\n" << text;
  }
  // The first run went on: more steps, its output untouched; SIGTERM saves its last step.
  const size_t before = train_records(out).size();
  const double t1 = lt::now_seconds();
  while (train_records(out).size() < before + 2 && lt::now_seconds() - t1 < 60)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE(train_records(out).size(), before + 2);
  ::kill(first, SIGTERM);
  EXPECT_EQ(exit_code(finish_process(first)), 130) << slurp(dir / "first.log");
  const auto recs = train_records(out);
  for (size_t i = 0; i < recs.size(); ++i) EXPECT_EQ(recs[i]["step"].get<int64_t>(), int64_t(i) + 1);
  const auto last = lt::train::latest_checkpoint(out);
  ASSERT_TRUE(last);
  EXPECT_EQ(last->step, int64_t(recs.size()));

  // Once the first run ended, a run into the same directory starts (resuming it).
  double s = 0;
  EXPECT_EQ(run_bounded({"train", cfg, "output_dir=" + out.string(), "max_steps=" + std::to_string(recs.size() + 1),
                         "resume_from_checkpoint=auto"},
                        dir / "third.log", 60, &s),
            0)
      << slurp(dir / "third.log");
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

}  // namespace
