// Bad input and failing writes at the lazytrain command line: each is an error (exit status 1, no signal, no
// "internal error") that names the option, file or directory, expected vs actual, and loses nothing.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <grp.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "../common/repo_path.h"
#include "cli_process.h"
#include "train/checkpoint_dir.h"

namespace fs = std::filesystem;

namespace {

struct ChildRun {
  int status = 0;  // wait status
  std::string log;  // stdout and stderr
  bool exited_with(int rc) const { return WIFEXITED(status) && WEXITSTATUS(status) == rc; }
};

// Runs lazytrain with `args`; `in_child` runs in the child before exec (limits, credentials).
ChildRun run_lazytrain(const std::vector<std::string>& args, const fs::path& log,
                  const std::function<void()>& in_child = {}) {
  std::vector<std::string> all = {lt::testing::lazytrain_binary()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    if (in_child) in_child();
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ChildRun r;
  ::waitpid(pid, &r.status, 0);
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  r.log = ss.str();
  return r;
}

struct TmpDir {
  fs::path p;
  TmpDir() {
    p = fs::temp_directory_path() / ("lt_input_errors_" + std::to_string(::getpid()) + "_" +
                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(p);
    fs::create_directories(p);
    fs::permissions(p, fs::perms::all);  // a child without root's rights writes its log here
  }
  ~TmpDir() {
    std::error_code ec;
    fs::permissions(p, fs::perms::all, ec);
    fs::remove_all(p, ec);
  }
};

fs::path tiny_config(const fs::path& dir) {
  const fs::path cfg = dir / "run.yaml";
  std::ofstream(cfg) << "model_name_or_path: tiny-qwen2\n"
                     << "model_overrides: {hidden_size: 64, num_hidden_layers: 2}\n"
                     << "tokenizer: " << (lt::testing::repo_root() / "configs" / "demo").string() << "\n"
                     << "template: chatml\ndataset: builtin:math\nmax_samples: 32\ncutoff_len: 96\n"
                     << "per_device_train_batch_size: 4\nmax_steps: 2\nsave_steps: 2\nlogging_steps: 1\n"
                     << "progress_bar: false\nthreads: 1\nbackend: cpu\n";
  fs::permissions(cfg, fs::perms::all);
  return cfg;
}

void expect_clean_error(const ChildRun& r, const std::string& what) {
  EXPECT_TRUE(r.exited_with(1)) << what << ": status " << r.status << "\n" << r.log;
  EXPECT_EQ(r.log.find("internal error"), std::string::npos) << what << "\n" << r.log;
}

}  // namespace

// eval and generate decode --batch-size sequences together: 0 or a negative count is an error naming the option
// (it was accepted), before any model is loaded; --threads below 0 too.
TEST(DecodeOptions, BatchSizeBelowOneIsAnError) {
  TmpDir d;
  const std::string model = (lt::testing::repo_root() / "tests" / "fixtures" / "hf" / "qwen2_bias_tied").string();
  for (const std::vector<std::string>& cmd :
       {std::vector<std::string>{"generate", "--model", model, "-p", "x"},
        std::vector<std::string>{"eval", "--model", model, "--dataset", "builtin:math-test"}}) {
    for (const char* bad : {"0", "-2"}) {
      auto args = cmd;
      args.insert(args.end(), {"--batch-size", bad});
      const ChildRun r = run_lazytrain(args, d.p / "log");
      expect_clean_error(r, cmd[0] + " --batch-size " + bad);
      EXPECT_NE(r.log.find("--batch-size must be >= 1"), std::string::npos) << r.log;
      EXPECT_NE(r.log.find(std::string("got ") + bad), std::string::npos) << r.log;
    }
    auto args = cmd;
    args.insert(args.end(), {"--threads", "-3"});
    const ChildRun r = run_lazytrain(args, d.p / "log");
    expect_clean_error(r, cmd[0] + " --threads -3");
    EXPECT_NE(r.log.find("--threads must be >= 0"), std::string::npos) << r.log;
  }
}

// A checkpoint save that runs out of space (here the file size limit, EFBIG, with SIGXFSZ ignored as a disk has no
// such signal) names the file and the OS reason, exits 1, and leaves the previous checkpoint the newest complete one.
TEST(CheckpointWrite, FailedSaveNamesTheFileAndTheReason) {
  TmpDir d;
  const fs::path cfg = tiny_config(d.p), out = d.p / "out";
  ASSERT_TRUE(run_lazytrain({"train", cfg.string(), "output_dir=" + out.string()}, d.p / "first.log").exited_with(0));
  ASSERT_TRUE(lt::train::is_complete_checkpoint(out / "checkpoint-2"));
  // The tiny model's files: bf16 weights ~190 KB, fp32 masters ~380 KB, optimizer.bin ~750 KB.
  const ChildRun r = run_lazytrain({"train", cfg.string(), "output_dir=" + out.string(), "resume_from_checkpoint=auto",
                               "max_steps=4"},
                              d.p / "second.log", [] {
                                ::signal(SIGXFSZ, SIG_IGN);
                                const rlimit lim{512 << 10, 512 << 10};
                                ::setrlimit(RLIMIT_FSIZE, &lim);
                              });
  expect_clean_error(r, "save over the file size limit");
  EXPECT_NE(r.log.find("optimizer.bin.tmp"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find(std::strerror(EFBIG)), std::string::npos) << r.log;
  const auto latest = lt::train::latest_checkpoint(out);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->path.filename(), "checkpoint-2");
  EXPECT_TRUE(lt::train::is_complete_checkpoint(out / "checkpoint-2"));
}

// An output_dir the run cannot write (created read-only; the child drops root's rights when it has them, which ignore
// permissions) is an error naming the directory and the OS reason, not a filesystem_error escaping as an internal
// error.
TEST(ReadOnlyOutputDir, IsAClearErrorNamingTheDirectory) {
  TmpDir d;
  const fs::path cfg = tiny_config(d.p), ro = d.p / "ro";
  fs::create_directories(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read | fs::perms::group_exec |
                          fs::perms::others_read | fs::perms::others_exec);
  const auto drop_root = [] {
    if (::geteuid() == 0 && (::setgroups(0, nullptr), ::setresgid(65534, 65534, 65534) != 0 ||
                             ::setresuid(65534, 65534, 65534) != 0))
      ::_exit(126);
  };
  for (const fs::path& od : {ro, ro / "new"}) {
    const ChildRun r = run_lazytrain({"train", cfg.string(), "output_dir=" + od.string()}, d.p / "ro.log", drop_root);
    if (r.exited_with(126)) GTEST_SKIP() << "cannot drop root's rights";
    expect_clean_error(r, od.string());
    EXPECT_NE(r.log.find(od.string()), std::string::npos) << r.log;
    EXPECT_NE(r.log.find(std::strerror(EACCES)), std::string::npos) << r.log;
  }
}

// SIGTERM while the data are prepared (here reading a JSONL file of 3 million malformed lines, ~20 s on a 2-core VM)
// stops the run within seconds with exit status 130 and a message saying that nothing was trained; it used to be
// either the default action (killed by the signal) or, once the handlers were installed, a wait for the first step.
TEST(StopSignal, SigtermDuringDataPreparationStopsWithinSeconds) {
  TmpDir d;
  const fs::path cfg = tiny_config(d.p), data = d.p / "slow.jsonl";
  {
    std::ofstream f(data);
    f << "{\"query\": \"What is 1 + 1?\", \"response\": \"2\"}\n";
    std::string block;
    for (int i = 0; i < 100000; ++i) block += "{x\n";
    for (int k = 0; k < 30; ++k) f << block;
  }
  const fs::path log = d.p / "stop.log";
  const pid_t pid = lt::testing::start_lazytrain(
      {"train", cfg.string(), "dataset=" + data.string(), "max_samples=0", "output_dir=" + (d.p / "out").string()}, log);
  ::usleep(1500 * 1000);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const int status = lt::testing::finish_process(pid);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string out = ss.str();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 130) << "status " << status << "\n" << out.substr(0, 2000);
  EXPECT_LT(waited, 5.0);
  EXPECT_NE(out.find("stopped by SIGTERM"), std::string::npos) << out.substr(0, 2000);
  EXPECT_NE(out.find("before the first step"), std::string::npos) << out.substr(0, 2000);
  EXPECT_FALSE(lt::train::latest_checkpoint(d.p / "out").has_value());
}
