// `lazytrain launch -n N -- train` (data parallel, ranks as processes on the CPU backend) against
// `lazytrain train` with the same global batch (docs/distributed.md, "Trainer"): N ranks with
// gradient_accumulation_steps G / N equal one process with G, within fp32 rounding (bit for bit with one
// micro-batch per rank); a checkpoint written by 2 ranks resumes on 4 ranks and on 1 process; rank 0
// alone writes the output directory, with every rank's figures; a rank killed or hung mid-run ends the
// job with a message within a bounded time and leaves only complete checkpoints; configurations that
// cannot run data-parallel are refused naming the config field.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/repo_path.h"
#include "cli_process.h"
#include "run_results.h"
#include "core/timer.h"
#include "io/safetensors.h"
#include "train/checkpoint_dir.h"

namespace fs = std::filesystem;
using lt::testing::finish_process;
using lt::testing::start_lazytrain;
using lt::testing::train_records;
using lt::testing::slurp;
using lt::testing::run_lazytrain;
using lt::testing::losses_by_step;
using lt::testing::checkpoint_masters;

namespace {

constexpr double kLr = 2e-3;

// Tiny Qwen2, 4 micro-batches of 2 x 64 per step for one process, 4 steps, a checkpoint every 2. N ranks
// take the same global batch with gradient_accumulation_steps=4/N (accumulation()).
fs::path write_config(const fs::path& dir) {
  const fs::path cfg = dir / "dp.yaml";
  std::ofstream(cfg) << "model_name_or_path: tiny-qwen2\n"
                     << "tokenizer: " << (lt::testing::repo_root() / "configs" / "demo").string() << "\n"
                     << "template: chatml\ndataset: builtin:math\nmax_samples: 64\ncutoff_len: 64\n"
                     << "per_device_train_batch_size: 2\ngradient_accumulation_steps: 4\n"
                     << "learning_rate: 2.0e-3\nwarmup_steps: 1\nmax_steps: 4\nsave_steps: 2\nlogging_steps: 1\n"
                     << "progress_bar: false\nthreads: 1\nbackend: cpu\n";
  return cfg;
}

// The override that gives n ranks the global batch of 4 micro-batches.
std::string accumulation(int n) { return "gradient_accumulation_steps=" + std::to_string(4 / n); }

struct WeightDiff {
  double max = 0;        // largest |a - b|
  double frac_over = 0;  // fraction of the weights with |a - b| > `over`
};
// Over every weight of two checkpoints (the tensor sets must be equal).
WeightDiff weight_diff(const fs::path& a, const fs::path& b, double over) {
  const auto wa = checkpoint_masters(a), wb = checkpoint_masters(b);
  EXPECT_EQ(wa.size(), wb.size());
  EXPECT_FALSE(wa.empty());
  WeightDiff d;
  int64_t n = 0, big = 0;
  for (const auto& [name, va] : wa) {
    auto it = wb.find(name);
    if (it == wb.end()) {
      ADD_FAILURE() << name << " missing in " << b;
      continue;
    }
    EXPECT_EQ(va.size(), it->second.size()) << name;
    for (size_t i = 0; i < va.size() && i < it->second.size(); ++i) {
      const double x = std::fabs(double(va[i]) - double(it->second[i]));
      d.max = std::max(d.max, x);
      big += x > over;
      ++n;
    }
  }
  d.frac_over = n ? double(big) / double(n) : 0.0;
  return d;
}

double max_weight_diff(const fs::path& a, const fs::path& b) { return weight_diff(a, b, 0).max; }

// Losses of the same steps agree within fp32 rounding (docs/distributed.md, "Numerics").
void expect_losses_match(const std::map<int64_t, double>& ref, const std::map<int64_t, double>& got, const char* what) {
  ASSERT_FALSE(got.empty()) << what;
  for (const auto& [step, loss] : got) {
    ASSERT_TRUE(ref.count(step)) << what << " step " << step;
    EXPECT_NEAR(loss, ref.at(step), 1e-5 * std::fabs(ref.at(step))) << what << " step " << step;
  }
}

class LaunchTrain : public ::testing::Test {
 protected:
  // One single-process run and one 2-rank run of the same config, shared by the tests.
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("lt_launch_train_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    cfg_ = write_config(dir_).string();
    single_rc_ = run_lazytrain({"train", cfg_, "output_dir=" + (dir_ / "single").string()}, dir_ / "single.log");
    dp2_rc_ = run_lazytrain(
        {"launch", "-n", "2", "--", "train", cfg_, accumulation(2), "output_dir=" + (dir_ / "dp2").string()},
        dir_ / "dp2.log");
  }
  static void TearDownTestSuite() {
    if (!::testing::UnitTest::GetInstance()->Failed()) fs::remove_all(dir_);  // kept to look into
  }
  void SetUp() override {
    ASSERT_EQ(single_rc_, 0) << slurp(dir_ / "single.log");
    ASSERT_EQ(dp2_rc_, 0) << slurp(dir_ / "dp2.log");
  }
  static inline fs::path dir_;
  static inline std::string cfg_;
  static inline int single_rc_ = -1, dp2_rc_ = -1;
};

TEST_F(LaunchTrain, TwoRanksEqualOneProcess) {
  const auto ref = losses_by_step(dir_ / "single"), dp = losses_by_step(dir_ / "dp2");
  ASSERT_EQ(ref.size(), 4u);
  ASSERT_EQ(dp.size(), 4u);
  expect_losses_match(ref, dp, "2 ranks");
  const double d = max_weight_diff(dir_ / "single" / "checkpoint-4", dir_ / "dp2" / "checkpoint-4");
  std::printf("2 ranks vs 1 process after 4 steps: max |w_dp - w_single| = %.3g (%.3g lr)\n", d, d / kLr);
  EXPECT_LE(d, 0.01 * kLr);  // fp32 moments: a different reduction order only (measured ~1e-3 lr)
  // The same checkpoint layout and trainer state as the single-process run.
  EXPECT_TRUE(lt::train::is_complete_checkpoint(dir_ / "dp2" / "checkpoint-2"));
  EXPECT_TRUE(lt::train::is_complete_checkpoint(dir_ / "dp2" / "checkpoint-4"));
  EXPECT_EQ(fs::file_size(dir_ / "dp2" / "checkpoint-4" / "trainer_state" / "optimizer.bin"),
            fs::file_size(dir_ / "single" / "checkpoint-4" / "trainer_state" / "optimizer.bin"));
}

// Four ranks (one micro-batch each: the ranks' gradients are summed in the order one process accumulates
// its micro-batches, so bit for bit), and 8-bit moments over two ranks (docs/distributed.md: a last-bit
// gradient difference can move a moment to the neighbouring code, which moves that weight by a part of
// lr: measured 0.1 lr on 1 of 94k weights after 4 steps, the others within 0.01 lr but 3).
TEST_F(LaunchTrain, FourRanksAndEightBitMomentsEqualOneProcess) {
  struct Case {
    const char* name;
    std::vector<std::string> single, ranks;
    double max_lr;   // largest weight difference, in lr
    double frac;     // fraction of the weights allowed beyond 0.01 lr
  };
  const std::string opt8 = "optimizer=adamw8bit";
  const std::vector<Case> cases = {
      {"4 ranks",
       {},
       {"launch", "-n", "4", "--", "train", cfg_, accumulation(4), "output_dir=" + (dir_ / "dp4").string()},
       0,
       0},
      {"2 ranks, adamw8bit",
       {"train", cfg_, opt8, "output_dir=" + (dir_ / "single8").string()},
       {"launch", "-n", "2", "--", "train", cfg_, opt8, accumulation(2), "output_dir=" + (dir_ / "dp2_8").string()},
       0.5,
       1e-3},
  };
  for (const auto& c : cases) {
    fs::path ref = dir_ / "single";
    if (!c.single.empty()) {
      ref = c.single.back().substr(std::string("output_dir=").size());
      ASSERT_EQ(run_lazytrain(c.single, ref.string() + ".log"), 0) << c.name << ": " << slurp(ref.string() + ".log");
    }
    const fs::path out = c.ranks.back().substr(std::string("output_dir=").size());
    ASSERT_EQ(run_lazytrain(c.ranks, out.string() + ".log"), 0) << c.name << ": " << slurp(out.string() + ".log");
    const auto got = losses_by_step(out);
    EXPECT_EQ(got.size(), 4u) << c.name;
    expect_losses_match(losses_by_step(ref), got, c.name);
    if (c.max_lr == 0) EXPECT_EQ(got, losses_by_step(ref)) << c.name;
    const WeightDiff d = weight_diff(ref / "checkpoint-4", out / "checkpoint-4", 0.01 * kLr);
    std::printf("%s vs 1 process after 4 steps: max |w_dp - w_single| = %.3g (%.3g lr), %.2g of the weights beyond "
                "0.01 lr\n",
                c.name, d.max, d.max / kLr, d.frac_over);
    EXPECT_LE(d.max, c.max_lr * kLr) << c.name;
    EXPECT_LE(d.frac_over, c.frac) << c.name;
    EXPECT_EQ(train_records(out).back()["ranks"].size(), c.ranks[2] == std::string("4") ? 4u : 2u) << c.name;
  }
}

TEST_F(LaunchTrain, RankZeroAloneWritesTheOutputWithEveryRanksFigures) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_ / "dp2")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"checkpoint-2", "checkpoint-4", "metrics.jsonl", "plan.json",
                                             "plan_report.txt", "profile.json"}));
  const auto recs = train_records(dir_ / "dp2");
  ASSERT_EQ(recs.size(), 4u);  // one record per step: rank 0 alone writes
  for (const auto& j : recs) {
    ASSERT_TRUE(j.contains("ranks")) << j.dump();
    ASSERT_EQ(j["ranks"].size(), 2u);
    int64_t tokens = 0, loss_tokens = 0;
    for (int r = 0; r < 2; ++r) {
      const auto& f = j["ranks"][size_t(r)];
      EXPECT_EQ(f["rank"].get<int>(), r);
      EXPECT_EQ(f["tokens"].get<int64_t>(), 2 * 2 * 64);  // 2 of the 4 micro-batches of 2 x 64
      EXPECT_GT(f["step_time_s"].get<double>(), 0);
      EXPECT_GT(f["host_peak_rss_bytes"].get<int64_t>(), 0);
      tokens += f["tokens"].get<int64_t>();
      loss_tokens += f["loss_tokens"].get<int64_t>();
    }
    EXPECT_EQ(tokens, j["tokens"].get<int64_t>());  // the global batch
    EXPECT_EQ(loss_tokens, j["loss_tokens"].get<int64_t>());
  }
  // The console: one line per step (rank 0's).
  const std::string log = slurp(dir_ / "dp2.log");
  size_t n = 0;
  for (size_t p = 0; (p = log.find("step 1/4 |", p)) != std::string::npos; ++p) ++n;
  EXPECT_EQ(n, 1u) << log;
}

TEST_F(LaunchTrain, ResumesWithAnotherNumberOfRanks) {
  const auto ref = losses_by_step(dir_ / "single");
  const std::string from = "resume_from_checkpoint=" + (dir_ / "dp2" / "checkpoint-2").string();
  struct Case {
    const char* name;
    std::vector<std::string> args;
  };
  const std::vector<Case> cases = {
      {"4 ranks",
       {"launch", "-n", "4", "--", "train", cfg_, from, accumulation(4), "output_dir=" + (dir_ / "r4").string()}},
      {"1 process", {"train", cfg_, from, "output_dir=" + (dir_ / "r1").string()}},
  };
  for (const auto& c : cases) {
    const fs::path out = c.args.back().substr(std::string("output_dir=").size());
    const fs::path log = out.string() + ".log";
    ASSERT_EQ(run_lazytrain(c.args, log), 0) << c.name << ": " << slurp(log);
    const auto got = losses_by_step(out);
    EXPECT_EQ(got.size(), 2u) << c.name;  // steps 3 and 4
    expect_losses_match(ref, got, c.name);
    const double d = max_weight_diff(dir_ / "single" / "checkpoint-4", out / "checkpoint-4");
    std::printf("saved by 2 ranks, resumed on %s: max |w - w_uninterrupted| = %.3g (%.3g lr)\n", c.name, d, d / kLr);
    EXPECT_LE(d, 0.01 * kLr) << c.name;
  }
}

// The pids of the launcher's children, by LT_RANK.
std::map<int, pid_t> rank_pids(pid_t launcher) {
  std::map<int, pid_t> m;
  std::istringstream kids(
      slurp(fs::path("/proc") / std::to_string(launcher) / "task" / std::to_string(launcher) / "children"));
  for (pid_t k; kids >> k;) {
    const std::string env = slurp(fs::path("/proc") / std::to_string(k) / "environ");
    const size_t p = env.find("LT_RANK=");
    if (p != std::string::npos && (p == 0 || env[p - 1] == '\0')) m[std::atoi(env.c_str() + p + 8)] = k;
  }
  return m;
}

// Starts a long 2-rank run (a checkpoint every step), waits for its third step, calls `hurt` with the
// launcher's and rank 1's pids, then waits for the launcher. Returns its exit code; *seconds: from
// `hurt` to the launcher's end.
int hurt_run(const std::string& cfg, const fs::path& out, const fs::path& log,
             const std::vector<std::string>& launch_opts, void (*hurt)(pid_t launcher, pid_t rank1), double* seconds) {
  std::vector<std::string> args = {"launch", "-n", "2"};
  args.insert(args.end(), launch_opts.begin(), launch_opts.end());
  for (const char* a : {"--", "train"}) args.push_back(a);
  args.insert(args.end(), {cfg, accumulation(2), "output_dir=" + out.string(), "max_steps=100000", "save_steps=1",
                           "save_total_limit=2", "max_samples=256"});
  const pid_t launcher = start_lazytrain(args, log);
  const double t0 = lt::now_seconds();
  while (train_records(out).size() < 3 && lt::now_seconds() - t0 < 30)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE(train_records(out).size(), 3u) << slurp(log);
  const auto pids = rank_pids(launcher);
  EXPECT_EQ(pids.size(), 2u);
  const double t1 = lt::now_seconds();
  if (pids.count(1)) hurt(launcher, pids.at(1));
  // Bounded: the launcher must end by itself; a hang is killed after 60 s and fails the test.
  int st = 0;
  while (::waitpid(launcher, &st, WNOHANG) == 0) {
    if (lt::now_seconds() - t1 > 60) {
      ::kill(launcher, SIGKILL);
      ::waitpid(launcher, &st, 0);
      ADD_FAILURE() << "the launch did not end within 60 s after `hurt`";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  *seconds = lt::now_seconds() - t1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// Only complete checkpoints in out (a save cut by the failure left nothing behind).
void expect_only_complete_checkpoints(const fs::path& out) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << "left behind: " << name;
    if (lt::train::checkpoint_step(e.path()) >= 0) {
      ++n;
      EXPECT_TRUE(lt::train::is_complete_checkpoint(e.path())) << name;
    }
  }
  EXPECT_GE(n, 1);
}

TEST_F(LaunchTrain, KilledRankEndsTheJobWithAMessage) {
  const fs::path out = dir_ / "killed", log = dir_ / "killed.log";
  double s = 0;
  const int rc = hurt_run(cfg_, out, log, {"--grace", "5"}, [](pid_t, pid_t r1) { ::kill(r1, SIGKILL); }, &s);
  const std::string text = slurp(log);
  EXPECT_NE(rc, 0) << text;  // the first failing rank's code: 137 (rank 1), or 1 if rank 0 was reaped first
  EXPECT_LT(s, 10.0) << text;             // found by rank 0 within ~0.1 s, not by a timeout
  EXPECT_NE(text.find("launch: rank 1 was killed by signal 9"), std::string::npos) << text;
  EXPECT_NE(text.find("rank(s) 1 exited"), std::string::npos) << text;  // rank 0's error names rank 1
  expect_only_complete_checkpoints(out);
}

TEST_F(LaunchTrain, HungRankTimesOutWithAMessage) {
  const fs::path out = dir_ / "hung", log = dir_ / "hung.log";
  double s = 0;
  const int rc = hurt_run(cfg_, out, log, {"--grace", "2", "--comm-timeout", "2"},
                          [](pid_t, pid_t r1) { ::kill(r1, SIGSTOP); }, &s);
  const std::string text = slurp(log);
  EXPECT_NE(rc, 0) << text;
  EXPECT_GE(s, 1.5) << text;
  EXPECT_LT(s, 15.0) << text;  // 2 s timeout + 2 s grace, then SIGKILL
  EXPECT_NE(text.find("rank(s) 1 did not arrive within 2 s"), std::string::npos) << text;
  expect_only_complete_checkpoints(out);
}

// SIGTERM to the launcher reaches every rank; they agree to stop after the same step, rank 0 saves it.
TEST_F(LaunchTrain, SigtermToTheLauncherStopsEveryRankAfterTheSameStepWithACheckpoint) {
  const fs::path out = dir_ / "stopped", log = dir_ / "stopped.log";
  double s = 0;
  const int rc = hurt_run(cfg_, out, log, {}, [](pid_t launcher, pid_t) { ::kill(launcher, SIGTERM); }, &s);
  const std::string text = slurp(log);
  EXPECT_EQ(rc, 130) << text;
  EXPECT_LT(s, 20.0) << text;
  const auto last = lt::train::latest_checkpoint(out);
  ASSERT_TRUE(last) << text;
  EXPECT_EQ(last->step, int64_t(train_records(out).size())) << "the checkpoint is of the last step done";
  EXPECT_NE(text.find("Resume with: lazytrain launch -n 2 -- train"), std::string::npos) << text;
  expect_only_complete_checkpoints(out);
}

// host_mem is the host's budget: each of the 2 ranks on this host plans with half of it (plan.json's
// dram_cap, the start-up line), one process with all of it.
TEST_F(LaunchTrain, EachRankPlansWithItsShareOfTheHostMemory) {
  const fs::path out = dir_ / "budget", log = dir_ / "budget.log";
  const int rc = run_lazytrain({"launch", "-n", "2", "--", "train", cfg_, accumulation(2), "host_mem=1GiB",
                                "max_steps=1", "output_dir=" + out.string()},
                               log);
  const std::string text = slurp(log);
  ASSERT_EQ(rc, 0) << text;
  const auto plan = nlohmann::json::parse(slurp(out / "plan.json"));
  EXPECT_EQ(plan.at("dram_cap").get<int64_t>(), int64_t(512) << 20) << text;
  EXPECT_EQ(plan.at("moment_shards").get<int>(), 2);
  EXPECT_NE(text.find("data parallel: world 2, 2 ranks per host: DRAM 512.0 MiB per rank x 2 = 1.00 GiB per host"),
            std::string::npos)
      << text;
  const fs::path one = dir_ / "budget1";
  ASSERT_EQ(run_lazytrain({"train", cfg_, "host_mem=1GiB", "max_steps=1", "output_dir=" + one.string()},
                          dir_ / "budget1.log"),
            0)
      << slurp(dir_ / "budget1.log");
  EXPECT_EQ(nlohmann::json::parse(slurp(one / "plan.json")).at("dram_cap").get<int64_t>(), int64_t(1) << 30);
}

TEST_F(LaunchTrain, RefusesWhatCannotRunDataParallelNamingTheField) {
  struct Case {
    std::string override_, needle;
  };
  for (const Case& c : {Case{"master_weights=bf16-sr", "master_weights 'bf16-sr'"},
                        Case{"gradients=device", "gradients 'device'"}}) {
    const fs::path log = dir_ / "refused.log";
    fs::remove(log);
    const int rc = run_lazytrain(
        {"launch", "-n", "2", "--", "train", cfg_, c.override_, "output_dir=" + (dir_ / "refused").string()}, log);
    const std::string text = slurp(log);
    EXPECT_NE(rc, 0) << c.override_;
    EXPECT_NE(text.find(c.needle), std::string::npos) << c.override_ << ":\n" << text;
  }
}

}  // namespace
