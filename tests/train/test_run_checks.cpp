// What a training run checks about its config before and while it trains (CPU backend, tiny model): keys a
// resume cannot change, a resume that has nothing left to do, the base model's name through resumes, and a
// gradient dtype the plan cannot honour.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/repo_path.h"
#include "../common/test_dir.h"
#include "core/error.h"
#include "io/model_io.h"
#include "train/checkpoint.h"
#include "train/checkpoint_dir.h"
#include "train/config.h"
#include "train/signals.h"
#include "train/trainer.h"

using namespace lt;
using namespace lt::train;

namespace {

struct TmpDir : lt::testing::TestDir {
  TmpDir() : TestDir("lt_run_checks_") {}
};

TrainConfig tiny_run(const fs::path& out, std::vector<std::string> extra = {}) {
  const std::string yaml = fmt::format(
      "model_name_or_path: tiny-qwen2\n"
      "model_overrides: {{hidden_size: 64, num_hidden_layers: 2}}\n"
      "tokenizer: {}/configs/demo\n"
      "template: chatml\n"
      "dataset: builtin:math\n"
      "max_samples: 32\n"
      "cutoff_len: 96\n"
      "per_device_train_batch_size: 4\n"
      "max_steps: 3\n"
      "logging_steps: 100\n"
      "save_steps: 0\n"
      "progress_bar: false\n"
      "threads: 1\n"
      "output_dir: {}\n",
      lt::testing::repo_root().string(), out.string());
  return parse_config(yaml, "test.yaml", extra);
}

TrainHooks quiet() {
  TrainHooks h;
  h.install_signal_handlers = false;
  return h;
}

// Trains `steps` steps of tiny_run(dir) and stops with a checkpoint (as a signal would).
void train_and_stop(const fs::path& dir, int steps) {
  TrainHooks h = quiet();
  h.stop_after_steps = steps;
  run_training(tiny_run(dir), h);
  ASSERT_TRUE(is_complete_checkpoint(checkpoint_path(dir, steps)));
}

std::string run_error(const TrainConfig& c) {
  try {
    run_training(c, quiet());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// model_overrides and seed cannot change on resume (the model's shape and the data order come from the checkpoint):
// an error naming each key, both values and why, instead of training the checkpoint's model without a word.
TEST(ResumeOverrides, ChangedModelOverridesOrSeedIsAnError) {
  TmpDir d;
  train_and_stop(d.p, 2);
  auto e = run_error(tiny_run(d.p, {"resume_from_checkpoint=auto", "model_overrides={hidden_size: 128}"}));
  EXPECT_NE(e.find("model_overrides"), std::string::npos) << e;
  EXPECT_NE(e.find("checkpoint-2"), std::string::npos) << e;
  EXPECT_NE(e.find("128"), std::string::npos) << e;
  EXPECT_NE(e.find("cannot change on resume"), std::string::npos) << e;
  e = run_error(tiny_run(d.p, {"resume_from_checkpoint=auto", "seed=7"}));
  EXPECT_NE(e.find("seed"), std::string::npos) << e;
  EXPECT_NE(e.find("42"), std::string::npos) << e;
  EXPECT_NE(e.find("7"), std::string::npos) << e;
  // Unchanged, the run resumes and finishes.
  TrainResult r = run_training(tiny_run(d.p, {"resume_from_checkpoint=auto"}), quiet());
  EXPECT_EQ(r.global_step, 3);
}

// model_name_or_path is not read on resume (the checkpoint holds the model): a changed one is named in a warning.
TEST(ResumeOverrides, ChangedModelPathIsNamedInAWarning) {
  TmpDir d;
  train_and_stop(d.p, 2);
  ::testing::internal::CaptureStderr();
  TrainResult r = run_training(tiny_run(d.p, {"resume_from_checkpoint=auto", "model_name_or_path=tiny-qwen3"}), quiet());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.global_step, 3);
  EXPECT_NE(err.find("model_name_or_path"), std::string::npos) << err;
  EXPECT_NE(err.find("tiny-qwen3"), std::string::npos) << err;
  EXPECT_NE(err.find("ignored"), std::string::npos) << err;
}

// A resumed run whose checkpoint is already at max_steps says so (and trains nothing) instead of exiting silently.
TEST(ResumeAtMaxSteps, SaysNothingToDo) {
  TmpDir d;
  run_training(tiny_run(d.p), quiet());
  ASSERT_TRUE(is_complete_checkpoint(checkpoint_path(d.p, 3)));
  ::testing::internal::CaptureStdout();
  TrainResult r = run_training(tiny_run(d.p, {"resume_from_checkpoint=auto"}), quiet());
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(r.global_step, 3);
  EXPECT_NE(out.find("nothing to do: checkpoint-3 is at step 3 = max_steps; raise max_steps to train further"),
            std::string::npos)
      << out;
}

// trainer_state.json's `model` keeps the base model through resumes, not the checkpoint resumed from.
TEST(ResumeModelName, TrainerStateKeepsTheBaseModel) {
  TmpDir d;
  train_and_stop(d.p, 1);
  TrainHooks h = quiet();
  h.stop_after_steps = 1;
  run_training(tiny_run(d.p, {"resume_from_checkpoint=auto"}), h);  // step 2, resumed from checkpoint-1
  run_training(tiny_run(d.p, {"resume_from_checkpoint=auto"}), quiet());  // step 3, resumed from checkpoint-2
  for (int step : {1, 2, 3}) EXPECT_EQ(read_trainer_state(checkpoint_path(d.p, step)).model_name, "tiny-qwen2") << step;
}

// gradient_dtype: bf16 holds wherever the plan keeps the gradients: with gradients: auto and room in DRAM the plan keeps
// them on the host in bf16 (the setting is honoured, not dropped), and with gradients: device they are held in bf16.
TEST(GradientDtype, Bf16IsHonouredOnTheHostAndOnTheDevice) {
  TmpDir d;
  EXPECT_EQ(run_training(tiny_run(d.p, {"gradient_dtype=bf16"}), quiet()).global_step, 3);
  std::ifstream plan(d.p / "plan.json");
  ASSERT_TRUE(plan.good());
  const auto j = nlohmann::json::parse(plan);
  EXPECT_EQ(j["gradients"], "host");
  EXPECT_EQ(j["gradient_dtype"], "bf16");
  EXPECT_EQ(run_training(tiny_run(d.p, {"gradient_dtype=bf16", "gradients=device", "overwrite_output_dir=true"}),
                         quiet())
                .global_step,
            3);
}

// cutoff_len longer than the model's max_position_embeddings would train positions the model has no RoPE range for
// (generate refuses them): an error naming both, before any data is tokenised.
TEST(CutoffLen, LongerThanMaxPositionIsAnError) {
  TmpDir d;
  const auto e = run_error(tiny_run(d.p, {"model_overrides={hidden_size: 64, num_hidden_layers: 2, "
                                          "max_position_embeddings: 64}",
                                          "cutoff_len=96"}));
  EXPECT_NE(e.find("cutoff_len 96"), std::string::npos) << e;
  EXPECT_NE(e.find("max_position_embeddings 64"), std::string::npos) << e;
  EXPECT_EQ(run_training(tiny_run(d.p / "ok", {"model_overrides={hidden_size: 64, num_hidden_layers: 2, "
                                               "max_position_embeddings: 96}",
                                        "cutoff_len=96"}),
                         quiet())
                .global_step,
            3);
}

// host_mem above the machine's physical memory (MemTotal) is an error naming both, before a plan counts on memory
// that is not there; within it the run trains.
TEST(HostMem, AboveTheMachinesMemoryIsAnError) {
  TmpDir d;
  const auto e = run_error(tiny_run(d.p, {"host_mem=65536GiB"}));
  EXPECT_NE(e.find("host_mem 65536GiB is more than this machine's memory"), std::string::npos) << e;
  EXPECT_NE(e.find("MemTotal"), std::string::npos) << e;
  EXPECT_EQ(run_training(tiny_run(d.p / "ok", {"host_mem=1GiB"}), quiet()).global_step, 3);
}

// A record far longer than cutoff_len (24k tokens) is truncated or skipped by `overlong`, and no batch is wider than
// cutoff_len (it made every batch 23,912 wide).
TEST(CutoffLen, OverlongRecordsNeverWidenTheBatch) {
  TmpDir d;
  const fs::path data = d.p / "long.jsonl";
  {
    std::ofstream f(data);
    for (int i = 0; i < 12; ++i) f << "{\"query\": \"What is " << i << " + 1?\", \"response\": \"" << i + 1 << "\"}\n";
    std::string long_text;
    for (int i = 0; i < 12000; ++i) long_text += std::to_string(i % 10) + " ";
    f << "{\"query\": \"" << long_text << "\", \"response\": \"ok\"}\n";
  }
  for (const char* policy : {"truncate", "skip"}) {
    int64_t widest = 0;
    TrainHooks h = quiet();
    h.on_step = [&](const StepMetrics& m) { widest = std::max(widest, m.tokens / 4); };  // rows = batch 4 x seq
    const fs::path out = d.p / policy;
    run_training(tiny_run(out, {"dataset=" + data.string(), "cutoff_len=64", std::string("overlong=") + policy,
                                "max_samples=0"}),
                 h);
    EXPECT_GT(widest, 0) << policy;
    EXPECT_LE(widest, 64) << policy;
  }
}

// A stop request (SIGINT/SIGTERM) that arrives before the first step (here before the run starts, as during data
// preparation) stops the run during its setup: nothing trained, nothing saved, the run says it was interrupted.
TEST(StopSignal, BeforeTheFirstStepStopsDuringSetup) {
  TmpDir d;
  TrainResult r;
  {
    StopSignals outer;  // the test's own handler: raise() sets the flag instead of ending the test binary
    std::raise(SIGTERM);
    TrainHooks h;
    h.install_signal_handlers = true;
    r = run_training(tiny_run(d.p), h);
  }
  StopSignals::reset();
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.global_step, 0);
  EXPECT_FALSE(latest_checkpoint(d.p).has_value());
}

// A stop request between the micro-batches of step 3 (gradient accumulation 2): the step is not applied, the state of
// step 2 is saved as checkpoint-2, the run reports the stop; resumed, it gives the uninterrupted run's losses and final
// masters bit for bit. During the first step of a run: nothing is saved.
void stop_between_micro_batches(const std::vector<std::string>& extra) {
  TmpDir d;
  std::vector<std::string> ov = {"gradient_accumulation_steps=2", "max_steps=4", "save_final=true"};
  ov.insert(ov.end(), extra.begin(), extra.end());
  const TrainResult full = run_training(tiny_run(d.p / "full", ov), quiet());
  ASSERT_EQ(full.losses.size(), 4u);
  TrainHooks h = quiet();
  std::vector<std::pair<int64_t, int64_t>> polled;
  h.stop_before_micro_batch = [&](int64_t step, int64_t next) {
    polled.emplace_back(step, next);
    return step == 3;
  };
  ::testing::internal::CaptureStdout();
  const TrainResult stopped = run_training(tiny_run(d.p / "split", ov), h);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_TRUE(stopped.interrupted);
  EXPECT_EQ(stopped.global_step, 2);
  EXPECT_EQ(polled, (std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 1}, {3, 1}}));
  EXPECT_NE(out.find("step 3: stopped before micro-batch 2 of 2; the step is not applied"), std::string::npos) << out;
  EXPECT_NE(out.find("training stopped after step 2/4; checkpoint saved to"), std::string::npos) << out;
  ASSERT_TRUE(is_complete_checkpoint(checkpoint_path(d.p / "split", 2)));
  auto resume = ov;
  resume.push_back("resume_from_checkpoint=auto");
  const TrainResult resumed = run_training(tiny_run(d.p / "split", resume), quiet());
  EXPECT_EQ(resumed.losses, full.losses);
  const ModelWeights a = load_model(checkpoint_path(d.p / "full", 4) / "trainer_state" / "master");
  const ModelWeights b = load_model(checkpoint_path(d.p / "split", 4) / "trainer_state" / "master");
  ASSERT_EQ(a.units.size(), b.units.size());
  for (size_t u = 0; u < a.units.size(); ++u) EXPECT_EQ(a.units[u], b.units[u]) << "unit " << u;
  // Stopped inside the first step of a run: the state is the one it started from; nothing is saved.
  TrainHooks first = quiet();
  first.stop_before_micro_batch = [](int64_t, int64_t) { return true; };
  ::testing::internal::CaptureStdout();
  const TrainResult none = run_training(tiny_run(d.p / "first", ov), first);
  const std::string out1 = ::testing::internal::GetCapturedStdout();
  EXPECT_TRUE(none.interrupted);
  EXPECT_EQ(none.global_step, 0);
  EXPECT_FALSE(latest_checkpoint(d.p / "first").has_value());
  EXPECT_NE(out1.find("training stopped during its first step: nothing was trained in this run"), std::string::npos)
      << out1;
}

TEST(StopSignal, BetweenMicroBatchesSavesThePreviousStep) { stop_between_micro_batches({}); }
// The same with the gradients held on the device (summed there over the micro-batches, streamed to the optimizer
// during the next step's forward) and in bf16.
TEST(StopSignal, BetweenMicroBatchesWithDeviceGradients) {
  stop_between_micro_batches({"gradients=device", "gradient_dtype=bf16"});
}
