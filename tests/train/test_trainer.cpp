// End-to-end trainer tests on a tiny model (CPU backend): exact resume, signal handling, checkpoint
// contents, save_total_limit, and a crash during a save keeping the previous checkpoint valid.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <csignal>
#include <fstream>

#include "../common/repo_path.h"
#include "../common/test_dir.h"
#include "train/signals.h"
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/model_io.h"
#include "plan/profile.h"
#include "train/checkpoint.h"
#include "train/checkpoint_dir.h"
#include "train/config.h"
#include "train/trainer.h"

using namespace lt;
using namespace lt::train;

namespace {

struct TmpDir : lt::testing::TestDir {
  explicit TmpDir(const std::string& tag = "") : TestDir("lt_trainer_test_", tag) {}
};

TrainConfig tiny_config(const fs::path& out, std::vector<std::string> extra = {}) {
  std::string yaml = fmt::format(
      "model_name_or_path: tiny-qwen2\n"
      "tokenizer: {}/configs/demo\n"
      "template: chatml\n"
      "dataset: builtin:math\n"
      "max_samples: 48\n"
      "cutoff_len: 96\n"
      "per_device_train_batch_size: 4\n"
      "gradient_accumulation_steps: 2\n"
      "learning_rate: 2.0e-3\n"
      "lr_scheduler_type: cosine\n"
      "warmup_steps: 1\n"
      "weight_decay: 0.01\n"
      "max_steps: 5\n"
      "logging_steps: 100\n"
      "save_steps: 0\n"
      "progress_bar: false\n"
      "threads: 1\n"
      "output_dir: {}\n",
      lt::testing::repo_root().string(), out.string());
  return parse_config(yaml, "test.yaml", extra);
}

TrainHooks quiet_hooks() {
  TrainHooks h;
  h.install_signal_handlers = false;
  return h;
}

// The masters two runs saved at a step, bit for bit.
void expect_same_masters(const fs::path& a_dir, const fs::path& b_dir, int step) {
  ModelWeights a = load_model(checkpoint_path(a_dir, step) / "trainer_state" / "master");
  ModelWeights b = load_model(checkpoint_path(b_dir, step) / "trainer_state" / "master");
  ASSERT_EQ(a.units.size(), b.units.size());
  for (size_t u = 0; u < a.units.size(); ++u) EXPECT_EQ(a.units[u], b.units[u]) << "step " << step << " unit " << u;
}

// A run with overrides ov stopped after `stop` steps (as a signal would), then resumed from its latest
// checkpoint to the end: the resumed run's result.
TrainResult stop_and_resume(const fs::path& dir, const std::vector<std::string>& ov, int stop) {
  TrainHooks h = quiet_hooks();
  h.stop_after_steps = stop;
  run_training(tiny_config(dir, ov), h);
  auto resumed = ov;
  resumed.push_back("resume_from_checkpoint=auto");
  return run_training(tiny_config(dir, resumed), quiet_hooks());
}

}  // namespace

TEST(Trainer, ExactResumeIsBitIdentical) {
  TmpDir full_dir("_full"), split_dir("_split");
  TrainResult full = run_training(tiny_config(full_dir.p), quiet_hooks());
  ASSERT_EQ(full.losses.size(), 5u);
  EXPECT_LT(full.losses.back(), full.losses.front());

  // Stop after 2 steps (as a signal would), then resume from the latest checkpoint.
  TrainHooks stop = quiet_hooks();
  stop.stop_after_steps = 2;
  TrainResult first = run_training(tiny_config(split_dir.p), stop);
  EXPECT_TRUE(first.interrupted);
  EXPECT_EQ(first.global_step, 2);
  ASSERT_TRUE(is_complete_checkpoint(checkpoint_path(split_dir.p, 2)));
  TrainResult resumed = run_training(tiny_config(split_dir.p, {"resume_from_checkpoint=auto"}), quiet_hooks());
  ASSERT_EQ(resumed.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(resumed.losses[i], full.losses[i]) << "step " << i + 1;

  expect_same_masters(full_dir.p, split_dir.p, 5);  // same final weights, bit for bit
}

// The overrides ov with one more.
static std::vector<std::string> plus(std::vector<std::string> ov, std::string extra) {
  ov.push_back(std::move(extra));
  return ov;
}

// gradients: device (held in device memory, streamed to the optimizer during the next forward) trains
// exactly as host gradients, with checkpoints and validation in between (each flushes the stream).
TEST(Trainer, GradientsOnTheDeviceTrainLikeHostGradients) {
  TmpDir host_dir("_host"), dev_dir("_dev");
  const std::vector<std::string> ov = {"save_steps=2", "eval_steps=2", "val_size=8"};
  TrainResult host = run_training(tiny_config(host_dir.p, ov), quiet_hooks());
  TrainResult dev = run_training(tiny_config(dev_dir.p, plus(ov, "gradients=device")), quiet_hooks());
  ASSERT_EQ(dev.losses.size(), 5u);
  EXPECT_EQ(dev.losses, host.losses);
  for (int step : {2, 5}) expect_same_masters(host_dir.p, dev_dir.p, step);
  auto eval_losses = [](const fs::path& dir) {
    std::ifstream m(dir / "metrics.jsonl");
    std::vector<double> v;
    for (std::string line; std::getline(m, line);) {
      auto j = nlohmann::json::parse(line);
      if (j["type"] == "eval") v.push_back(j["eval_loss"].get<double>());
    }
    return v;
  };
  EXPECT_EQ(eval_losses(dev_dir.p).size(), 2u);
  EXPECT_EQ(eval_losses(dev_dir.p), eval_losses(host_dir.p));
}

// embedding_update: device (the tied embedding's AdamW step on the backend, exec/device_update.h; on the CPU backend
// auto keeps it on the host) trains exactly as the CPU optimizer, with checkpoints (each writes the device copy back)
// and validation in between, and a run stopped and resumed (the device copy loaded from the checkpoint) is
// bit-identical too.
TEST(Trainer, EmbeddingUpdateOnTheDeviceTrainsAndResumesExactly) {
  TmpDir host_dir("_host"), dev_dir("_dev"), split_dir("_split");
  const std::vector<std::string> ov = {"save_steps=2", "eval_steps=2", "val_size=8"};
  TrainResult host = run_training(tiny_config(host_dir.p, ov), quiet_hooks());
  TrainResult dev = run_training(tiny_config(dev_dir.p, plus(ov, "embedding_update=device")), quiet_hooks());
  ASSERT_EQ(dev.losses.size(), 5u);
  EXPECT_EQ(dev.losses, host.losses);
  for (int step : {2, 5}) expect_same_masters(host_dir.p, dev_dir.p, step);
  std::ifstream plan(dev_dir.p / "plan.json");
  ASSERT_TRUE(plan.good());
  EXPECT_EQ(nlohmann::json::parse(plan)["embedding_update"], "device");
  TrainResult resumed = stop_and_resume(split_dir.p, {"embedding_update=device"}, 2);
  TmpDir full_dir("_full");
  TrainResult full = run_training(tiny_config(full_dir.p, {"embedding_update=device"}), quiet_hooks());
  EXPECT_EQ(resumed.losses, full.losses);
  expect_same_masters(full_dir.p, split_dir.p, 5);
  // An untied model cannot: the error names why.
  TmpDir bad("_bad");
  try {
    run_training(tiny_config(bad.p, {"embedding_update=device", "model_name_or_path=tiny-qwen3"}), quiet_hooks());
    ADD_FAILURE() << "embedding_update=device on an untied model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not tied"), std::string::npos) << e.what();
  }
}

// device_update_layers (the first layers' AdamW steps on the device; here the CPU backend's "device"), with 8-bit
// moments on the optimizer's scalar path (which the device op matches bit for bit): the same losses and masters as
// the host update, plan.json records the count, a stop and resume is exact; bad counts are refused with the key.
TEST(Trainer, FirstLayersUpdatedOnTheDeviceTrainAndResumeExactly) {
  const char* old_isa = std::getenv("LT_OPTIM_ISA");
  const std::string saved = old_isa ? old_isa : "";
  ::setenv("LT_OPTIM_ISA", "scalar", 1);
  TmpDir host_dir("_host"), dev_dir("_dev"), split_dir("_split"), full_dir("_full");
  const std::vector<std::string> ov = {"save_steps=2", "eval_steps=2", "val_size=8", "optimizer=adamw8bit"};
  TrainResult host = run_training(tiny_config(host_dir.p, ov), quiet_hooks());
  TrainResult dev = run_training(tiny_config(dev_dir.p, plus(ov, "device_update_layers=2")), quiet_hooks());
  ASSERT_EQ(dev.losses.size(), 5u);
  EXPECT_EQ(dev.losses, host.losses);
  for (int step : {2, 5}) expect_same_masters(host_dir.p, dev_dir.p, step);
  std::ifstream plan(dev_dir.p / "plan.json");
  ASSERT_TRUE(plan.good());
  EXPECT_EQ(nlohmann::json::parse(plan)["device_update_layers"], 2);
  const std::vector<std::string> dv = {"optimizer=adamw8bit", "device_update_layers=2"};
  TrainResult resumed = stop_and_resume(split_dir.p, dv, 2);
  TrainResult full = run_training(tiny_config(full_dir.p, dv), quiet_hooks());
  EXPECT_EQ(resumed.losses, full.losses);
  expect_same_masters(full_dir.p, split_dir.p, 5);
  for (const char* bad : {"device_update_layers=two", "device_update_layers=-1", "device_update_layers=99"}) {
    TmpDir b("_bad");
    try {
      run_training(tiny_config(b.p, {bad}), quiet_hooks());
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("device_update_layers"), std::string::npos) << e.what();
    }
  }
  if (old_isa) ::setenv("LT_OPTIM_ISA", saved.c_str(), 1);
  else ::unsetenv("LT_OPTIM_ISA");
}

// gradient_dtype: bf16 (held gradients rounded to bf16): trains close to fp32 gradients, and a run
// stopped and resumed is bit-identical to the uninterrupted one.
TEST(Trainer, Bf16HeldGradientsTrainAndResumeExactly) {
  TmpDir f32_dir("_f32"), full_dir("_full"), split_dir("_split");
  const std::vector<std::string> ov = {"gradients=device", "gradient_dtype=bf16"};
  TrainResult f32 = run_training(tiny_config(f32_dir.p, {"gradients=device", "gradient_dtype=fp32"}), quiet_hooks());
  TrainResult full = run_training(tiny_config(full_dir.p, ov), quiet_hooks());
  ASSERT_EQ(full.losses.size(), 5u);
  EXPECT_NE(full.losses, f32.losses);  // the rounding is there
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(full.losses[i], f32.losses[i], 2e-3 * f32.losses[i]) << "step " << i + 1;
  TrainResult resumed = stop_and_resume(split_dir.p, ov, 2);
  EXPECT_EQ(resumed.losses, full.losses);
  std::ifstream plan(full_dir.p / "plan.json");
  ASSERT_TRUE(plan.good());
  EXPECT_EQ(nlohmann::json::parse(plan)["gradient_dtype"], "bf16");
}

// gradients: host with gradient_dtype: bf16 (one micro-batch per step): the host gradients are the held bf16 ones bit
// for bit (tiny-qwen2 is tied: every gradient leaves the device rounded), so the run equals the held-bf16 run, and a
// run stopped and resumed is bit-identical to the uninterrupted one.
TEST(Trainer, HostBf16GradientsTrainLikeHeldBf16AndResumeExactly) {
  TmpDir held_dir("_held"), full_dir("_full"), split_dir("_split");
  const std::vector<std::string> ov = {"gradients=host", "gradient_dtype=bf16", "gradient_accumulation_steps=1"};
  TrainResult held = run_training(
      tiny_config(held_dir.p, {"gradients=device", "gradient_dtype=bf16", "gradient_accumulation_steps=1"}),
      quiet_hooks());
  TrainResult full = run_training(tiny_config(full_dir.p, ov), quiet_hooks());
  ASSERT_EQ(full.losses.size(), 5u);
  EXPECT_EQ(full.losses, held.losses);
  expect_same_masters(held_dir.p, full_dir.p, 5);
  TrainResult resumed = stop_and_resume(split_dir.p, ov, 2);
  EXPECT_EQ(resumed.losses, full.losses);
  std::ifstream plan(full_dir.p / "plan.json");
  ASSERT_TRUE(plan.good());
  const auto j = nlohmann::json::parse(plan);
  EXPECT_EQ(j["gradients"], "host");
  EXPECT_EQ(j["gradient_dtype"], "bf16");
  // Several micro-batches per step with bf16 host gradients: refused by the planner, naming why.
  TmpDir ga_dir("_ga");
  try {
    run_training(tiny_config(ga_dir.p, {"gradients=host", "gradient_dtype=bf16"}), quiet_hooks());
    ADD_FAILURE() << "gradient_accumulation_steps 2 with bf16 host gradients";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 micro-batches per step"), std::string::npos) << e.what();
  }
}

// The demo's configuration (configs/demo.yaml) for a few steps with bf16 host gradients: finite losses that fall.
TEST(Trainer, DemoWithHostBf16GradientsTrainsAndTheLossFalls) {
  TmpDir t;
  const fs::path root = lt::testing::repo_root();
  TrainResult r = run_training(
      load_config(root / "configs" / "demo.yaml",
                  {"gradients=host", "gradient_dtype=bf16", "max_steps=12", "warmup_steps=2", "save_steps=0",
                   "logging_steps=100", "progress_bar=false", "do_eval_dataset=", "max_samples=512",
                   "tokenizer=" + (root / "configs" / "demo").string(), "output_dir=" + t.p.string()}),
      quiet_hooks());
  ASSERT_EQ(r.losses.size(), 12u);
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_EQ(r.skipped_steps, 0);
  EXPECT_LT(r.losses.back(), 0.8 * r.losses.front());
  std::ifstream plan(t.p / "plan.json");
  ASSERT_TRUE(plan.good());
  EXPECT_EQ(nlohmann::json::parse(plan)["gradient_dtype"], "bf16");
}

TEST(Trainer, CheckpointIsHfModelDirPlusTrainerState) {
  TmpDir t;
  TrainResult r = run_training(tiny_config(t.p, {"max_steps=4", "save_steps=1", "save_total_limit=2"}), quiet_hooks());
  auto cks = list_checkpoints(t.p);
  ASSERT_EQ(cks.size(), 2u);  // save_total_limit
  EXPECT_EQ(cks[0].step, 3);
  EXPECT_EQ(cks[1].step, 4);
  fs::path c = cks[1].path;
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                        "trainer_config.yaml", "COMPLETE", "trainer_state/trainer_state.json",
                        "trainer_state/optimizer.bin", "trainer_state/master/model.safetensors"})
    EXPECT_TRUE(fs::exists(c / f)) << f;
  // The HF model loads and has bf16 weights close to the fp32 masters.
  ModelWeights hf = load_model(c);
  ModelWeights master = load_model(c / "trainer_state" / "master");
  for (size_t u = 0; u < hf.units.size(); ++u)
    for (size_t i = 0; i < hf.units[u].size(); ++i)
      ASSERT_NEAR(hf.units[u][i], master.units[u][i], 1e-2f * (std::abs(master.units[u][i]) + 1e-3f));
  TrainerState s = read_trainer_state(c);
  EXPECT_EQ(s.global_step, 4);
  EXPECT_EQ(s.losses, r.losses);
  // metrics file: one train record per step
  std::ifstream m(t.p / "metrics.jsonl");
  int train_lines = 0;
  for (std::string line; std::getline(m, line);)
    if (nlohmann::json::parse(line)["type"] == "train") ++train_lines;
  EXPECT_EQ(train_lines, 4);
}

TEST(Trainer, CrashDuringSaveKeepsPreviousCheckpoint) {
  TmpDir t;
  CheckpointWriter::fault_hook = [](const std::string& stage) {
    static int renames = 0;
    if (stage == "rename" && ++renames == 2) throw Error("injected crash during save");
  };
  EXPECT_THROW(run_training(tiny_config(t.p, {"max_steps=4", "save_steps=2"}), quiet_hooks()), Error);
  CheckpointWriter::fault_hook = nullptr;
  auto last = latest_checkpoint(t.p);
  ASSERT_TRUE(last);
  EXPECT_EQ(last->step, 2);
  // auto-resume continues from it and finishes.
  TrainResult r = run_training(tiny_config(t.p, {"max_steps=4", "save_steps=2", "resume_from_checkpoint=auto"}),
                               quiet_hooks());
  EXPECT_EQ(r.global_step, 4);
  EXPECT_EQ(latest_checkpoint(t.p)->step, 4);
}

TEST(Trainer, SigtermFinishesStepSavesAndStops) {
  TmpDir t;
  TrainHooks h;
  h.install_signal_handlers = true;
  h.on_step = [](const StepMetrics& m) {
    if (m.step == 2) std::raise(SIGTERM);
  };
  TrainResult r = run_training(tiny_config(t.p), h);
  StopSignals::reset();
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.global_step, 2);
  EXPECT_TRUE(is_complete_checkpoint(checkpoint_path(t.p, 2)));
}

TEST(Trainer, RefusesToOverwriteCheckpointsWithoutResume) {
  TmpDir t;
  run_training(tiny_config(t.p, {"max_steps=1"}), quiet_hooks());
  try {
    run_training(tiny_config(t.p, {"max_steps=1"}), quiet_hooks());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("resume_from_checkpoint=auto"), std::string::npos) << e.what();
  }
}

TEST(Trainer, ExactResumeWith8BitStatesAndPacking) {
  TmpDir full_dir("_full"), split_dir("_split");
  std::vector<std::string> ov = {"optimizer=adamw8bit", "packing=true", "cutoff_len=160", "max_steps=3",
                                 "gradient_accumulation_steps=1"};
  TrainResult full = run_training(tiny_config(full_dir.p, ov), quiet_hooks());
  TrainResult resumed = stop_and_resume(split_dir.p, ov, 1);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed.losses[i], full.losses[i]) << "step " << i + 1;
  TrainerState s = read_trainer_state(checkpoint_path(split_dir.p, 3));
  EXPECT_FALSE(s.tensors_8bit.empty());  // adamw8bit: every layer matrix
  // resuming with another optimizer is refused
  auto ov3 = ov;
  ov3.push_back("resume_from_checkpoint=auto");
  ov3[0] = "optimizer=adamw";
  ov3.push_back("max_steps=4");
  EXPECT_THROW(run_training(tiny_config(split_dir.p, ov3), quiet_hooks()), Error);
}

TEST(Trainer, PeriodicValidationLossAndExactMatchRecords) {
  TmpDir t;
  TrainResult r = run_training(tiny_config(t.p, {"max_steps=2", "eval_steps=1", "val_size=8", "save_final=false",
                                                 "do_eval_dataset=builtin:math-test", "eval_max_samples=4",
                                                 "max_new_tokens=8"}),
                               quiet_hooks());
  EXPECT_TRUE(list_checkpoints(t.p).empty());  // save_steps 0 and save_final false
  EXPECT_EQ(r.eval_samples, 4);
  std::ifstream m(t.p / "metrics.jsonl");
  int evals = 0, em = 0;
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "eval") {
      ++evals;
      EXPECT_GT(j["eval_loss"].get<double>(), 0.0);
      EXPECT_GT(j["tokens"].get<int64_t>(), 0);
    }
    if (j["type"] == "exact_match") ++em;
  }
  EXPECT_EQ(evals, 2);
  EXPECT_EQ(em, 1);
  std::ifstream res(t.p / "eval_results.jsonl");
  int lines = 0;
  for (std::string line; std::getline(res, line);) ++lines;
  EXPECT_EQ(lines, 4);
}

TEST(Trainer, NvmeMomentsTrainAndResumeInDramBitIdentically) {
  TmpDir full_dir("_full"), split_dir("_split"), nvme_dir("_nvme");
  std::vector<std::string> ov = {"optimizer=adamw8bit", "max_steps=3", "gradient_accumulation_steps=1"};
  TrainResult full = run_training(tiny_config(full_dir.p, ov), quiet_hooks());
  // Two steps with every layer's moments on NVMe, checkpointed, then resumed with them in DRAM.
  auto on_nvme = ov;
  on_nvme.push_back("optimizer_nvme=all");
  on_nvme.push_back("nvme_dir=" + nvme_dir.p.string());
  TrainHooks stop = quiet_hooks();
  stop.stop_after_steps = 2;
  run_training(tiny_config(split_dir.p, on_nvme), stop);
  EXPECT_TRUE(fs::is_empty(nvme_dir.p)) << "NVMe moment files left behind";
  auto resume = ov;
  resume.push_back("resume_from_checkpoint=auto");
  TrainResult resumed = run_training(tiny_config(split_dir.p, resume), quiet_hooks());
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed.losses[i], full.losses[i]) << "step " << i + 1;
}

// Moments on NVMe (every layer's) with bf16 host gradients, stopped with a checkpoint and resumed with them on NVMe
// again: bit-identical to the uninterrupted run with every moment in DRAM (losses and masters), and no NVMe file is
// left behind (the files are scratch; the checkpoint holds the state).
TEST(Trainer, NvmeMomentsResumeOnNvmeBitIdentically) {
  TmpDir full_dir("_full"), split_dir("_split"), nvme_dir("_nvme");
  const std::vector<std::string> ov = {"optimizer=adamw8bit", "max_steps=4", "gradient_accumulation_steps=1",
                                       "gradients=host", "gradient_dtype=bf16"};
  TrainResult full = run_training(tiny_config(full_dir.p, ov), quiet_hooks());
  auto on_nvme = ov;
  on_nvme.push_back("optimizer_nvme=all");
  on_nvme.push_back("nvme_dir=" + nvme_dir.p.string());
  TrainResult resumed = stop_and_resume(split_dir.p, on_nvme, 2);
  ASSERT_EQ(resumed.losses.size(), 4u);
  EXPECT_EQ(resumed.losses, full.losses);
  expect_same_masters(full_dir.p, split_dir.p, 4);
  EXPECT_TRUE(fs::is_empty(nvme_dir.p)) << "NVMe moment files left behind";
  // The plan counts what ran: every decoder layer's moments on NVMe (optimizer_nvme all).
  nlohmann::json plan;
  std::ifstream(split_dir.p / "plan.json") >> plan;
  EXPECT_EQ(plan.value("nvme_moment_layers", int64_t(0)), 2);  // tiny-qwen2's 2 layers
}

namespace {

// embedding_rows_first (an untied table looked up on the host): the next step's rows updated first change no loss
// and no weight, bit for bit.
TEST(Trainer, EmbeddingRowsFirstTrainsExactlyAsWithout) {
  TmpDir plain_dir("_plain"), first_dir("_rows_first");
  const std::vector<std::string> ov = {"model_overrides={tie_word_embeddings: false}", "max_steps=4",
                                       "gradient_accumulation_steps=1"};
  TrainResult plain = run_training(tiny_config(plain_dir.p, plus(ov, "embedding_rows_first=false")), quiet_hooks());
  TrainResult first = run_training(tiny_config(first_dir.p, plus(ov, "embedding_rows_first=true")), quiet_hooks());
  ASSERT_EQ(plain.losses.size(), 4u);
  EXPECT_EQ(first.losses, plain.losses);
  expect_same_masters(plain_dir.p, first_dir.p, 4);
}

// gradient_ring_depth with gradients held on the device: a one-unit staging ring (recorded in plan.json) trains
// exactly as the default one, bit for bit.
TEST(Trainer, GradientRingDepthTrainsExactlyAsTheDefault) {
  TmpDir deep_dir("_ring8"), shallow_dir("_ring1");
  const std::vector<std::string> ov = {"gradients=device", "max_steps=4", "gradient_accumulation_steps=1"};
  TrainResult deep = run_training(tiny_config(deep_dir.p, ov), quiet_hooks());
  TrainResult shallow = run_training(tiny_config(shallow_dir.p, plus(ov, "gradient_ring_depth=1")), quiet_hooks());
  ASSERT_EQ(deep.losses.size(), 4u);
  EXPECT_EQ(shallow.losses, deep.losses);
  expect_same_masters(deep_dir.p, shallow_dir.p, 4);
  std::ifstream f(shallow_dir.p / "plan.json");
  EXPECT_EQ(nlohmann::json::parse(f).at("gradient_ring_depth"), 1);
  // The plan reports a smaller ring.
  auto ring_line = [](const fs::path& dir) {
    std::ifstream rep(dir / "plan_report.txt");
    const std::string all((std::istreambuf_iterator<char>(rep)), std::istreambuf_iterator<char>());
    const size_t at = all.find("gradient staging ring (pinned)");
    return at == std::string::npos ? std::string() : all.substr(at, all.find('\n', at) - at);
  };
  EXPECT_FALSE(ring_line(deep_dir.p).empty());
  EXPECT_NE(ring_line(shallow_dir.p), ring_line(deep_dir.p));
}

// head_gradient: slices (bf16 gradients held on the device, an untied head): the run trains bit for bit as with the
// full fp32 buffers; plan.json and the plan's report say so.
TEST(Trainer, HeadGradientBySlicesTrainsExactlyAsTheFullGradient) {
  TmpDir full_dir("_head_full"), sliced_dir("_head_slices");
  const std::vector<std::string> ov = {"gradients=device", "gradient_dtype=bf16", "max_steps=3",
                                       "gradient_accumulation_steps=1", "model_overrides={tie_word_embeddings: false}"};
  TrainResult full = run_training(tiny_config(full_dir.p, plus(ov, "head_gradient=full")), quiet_hooks());
  TrainResult sliced = run_training(tiny_config(sliced_dir.p, plus(ov, "head_gradient=slices")), quiet_hooks());
  ASSERT_EQ(full.losses.size(), 3u);
  EXPECT_EQ(sliced.losses, full.losses);
  expect_same_masters(full_dir.p, sliced_dir.p, 3);
  auto plan_json = [](const fs::path& dir) {
    std::ifstream f(dir / "plan.json");
    return nlohmann::json::parse(f);
  };
  EXPECT_EQ(plan_json(sliced_dir.p).at("head_grad_slices"), true);
  EXPECT_FALSE(plan_json(full_dir.p).contains("head_grad_slices"));
  std::ifstream rep(sliced_dir.p / "plan_report.txt");
  const std::string all((std::istreambuf_iterator<char>(rep)), std::istreambuf_iterator<char>());
  EXPECT_NE(all.find("gradient scratch (fp32, head sliced)"), std::string::npos) << all;
  // Asked for where it cannot apply: an error naming why, before training.
  TmpDir tied_dir("_head_tied");
  try {
    run_training(tiny_config(tied_dir.p, {"gradients=device", "gradient_dtype=bf16", "head_gradient=slices"}),
                 quiet_hooks());
    ADD_FAILURE() << "a tied model with head_gradient: slices trained";
  } catch (const lt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_gradient: slices needs gradients held on the device in bf16 and an LM "
                                         "head of its own, but tiny-qwen2 ties its LM head to the embedding"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace

namespace {

// The CPU optimizer's achieved rate is reported from the second step (the first step's update runs beside the second
// step), beside the profile's rate the planner used, in the log line and metrics.jsonl.
TEST(Trainer, ReportsTheOptimizersAchievedRate) {
  TmpDir t;
  std::vector<double> rate, profile;
  TrainHooks h = quiet_hooks();
  h.on_step = [&](const StepMetrics& m) {
    rate.push_back(m.optimizer_params_per_s);
    profile.push_back(m.optimizer_params_per_s_profile);
  };
  run_training(tiny_config(t.p, {"max_steps=3", "gradient_accumulation_steps=1"}), h);
  ASSERT_EQ(rate.size(), 3u);
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_GT(rate[i], 0) << "step " << i + 1;
    EXPECT_GT(profile[i], 0) << "step " << i + 1;
  }
  std::ifstream f(t.p / "metrics.jsonl");
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(all.find("\"optimizer_params_per_s\""), std::string::npos);
}

// The plan report's packed-rows line (plan/report.h packed_rows_line): the fraction it names, -1 without the line.
double reported_attention_fraction(const fs::path& out) {
  std::ifstream f(out / "plan_report.txt");
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string key = "layer's time scaled by ";
  const size_t at = all.find(key);
  return at == std::string::npos ? -1.0 : std::stod(all.substr(at + key.size()));
}

TEST(Trainer, PackedRunPlansWithTheDatasAttentionFraction) {
  TmpDir packed("_packed"), padded("_padded");
  // builtin:math samples are under 96 tokens: rows of 160 hold two or more, so each row's segments' squares sum to
  // well under 160^2.
  run_training(tiny_config(packed.p, {"packing=true", "cutoff_len=160", "max_steps=1", "gradient_accumulation_steps=1"}),
               quiet_hooks());
  const double f = reported_attention_fraction(packed.p);
  EXPECT_GT(f, 0.0);
  EXPECT_LT(f, 0.75);
  run_training(tiny_config(padded.p, {"max_steps=1", "gradient_accumulation_steps=1"}), quiet_hooks());
  EXPECT_EQ(reported_attention_fraction(padded.p), -1.0);  // unpacked rows: fraction 1, no line
}

// The profile a run planned with is in its output directory, loadable for `lazytrain plan --profile`, with the
// config's caps applied.
TEST(Trainer, WritesTheProfileItPlannedWith) {
  TmpDir t;
  run_training(tiny_config(t.p, {"max_steps=1", "gradient_accumulation_steps=1", "host_mem=3GiB"}), quiet_hooks());
  const ResourceProfile p = load_profile_file(t.p / "profile.json");
  EXPECT_EQ(p.dram_bytes, int64_t(3) << 30);
  EXPECT_GT(p.opt_fp32_params_per_s, 0);
}

}  // namespace
