// Training never goes on silently with non-finite values (CPU backend, tiny model): a NaN put into one weight
// stops training at the step that makes max_skipped_steps skipped steps in a row (0 or 1: the first) with an error
// naming that parameter and the step, no
// checkpoint is written of the state after skipped steps (the last good one stays byte for byte), a run whose
// skipped steps are transient finishes and counts them, and every data-parallel rank stops after the same step.
// Also the diagnosis texts for a gradient that turns non-finite with finite weights.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "../common/repo_path.h"
#include "../common/test_dir.h"
#include "core/error.h"
#include "exec/host_state.h"
#include "model/model_config.h"
#include "model/param_layout.h"
#include "train/checkpoint.h"
#include "train/checkpoint_dir.h"
#include "train/config.h"
#include "train/nonfinite.h"
#include "train/trainer.h"

using namespace lt;
using namespace lt::train;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const char* const kBadTensor = "model.layers.1.mlp.down_proj.weight";  // unit 2 of tiny-qwen2 (2 layers)

struct TmpDir : lt::testing::TestDir {
  explicit TmpDir(const std::string& tag = "") : TestDir("lt_nonfinite_test_", tag) {}
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
      "warmup_steps: 1\n"
      "max_steps: 6\n"
      "logging_steps: 100\n"
      "save_steps: 0\n"
      "progress_bar: false\n"
      "threads: 1\n"
      "output_dir: {}\n",
      lt::testing::repo_root().string(), out.string());
  return parse_config(yaml, "test.yaml", extra);
}

// Sets element i of the full-named parameter in the host masters to v; returns the value it had.
float set_weight(HostState& st, const ModelLayout& layout, const std::string& name, int64_t i, float v) {
  for (size_t u = 0; u < layout.units.size(); ++u)
    for (const ParamInfo& p : layout.units[u].params) {
      if (p.name != name) continue;
      std::vector<float> w(static_cast<size_t>(st.numel(int64_t(u))));
      st.read_master(int64_t(u), w.data());
      const float old = w[size_t(p.offset + i)];
      w[size_t(p.offset + i)] = v;
      st.write_master(int64_t(u), w.data());
      return old;
    }
  throw Error("no parameter " + name);
}

// Hooks that put a NaN into kBadTensor before step `at` (and, when `until` > 0, the old value back before step
// `until`), recording the steps run.
struct NanInjection {
  int64_t at = 0, until = 0;
  std::vector<int64_t> steps;
  float old = 0;
  TrainHooks hooks() {
    TrainHooks h;
    h.install_signal_handlers = false;
    h.before_step = [this](int64_t step, HostState& st, const ModelLayout& layout) {
      if (step == at) old = set_weight(st, layout, kBadTensor, 5, kNaN);
      if (step == until) set_weight(st, layout, kBadTensor, 5, old);
    };
    h.on_step = [this](const StepMetrics& m) { steps.push_back(m.step); };
    return h;
  }
};

// Runs training; the lt::Error's message ("" when none) and what went to stdout.
struct Outcome {
  std::string error, out;
  TrainResult result;
};
Outcome run_caught(const TrainConfig& c, const TrainHooks& h) {
  Outcome o;
  ::testing::internal::CaptureStdout();
  try {
    o.result = run_training(c, h);
  } catch (const Error& e) {
    o.error = e.what();
  }
  o.out = ::testing::internal::GetCapturedStdout();
  return o;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<nlohmann::json> records(const fs::path& out, const std::string& type) {
  std::vector<nlohmann::json> v;
  std::ifstream f(out / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == type) v.push_back(j);
  }
  return v;
}

// Every file under dir with its bytes.
std::map<std::string, std::string> tree_bytes(const fs::path& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    m[fs::relative(e.path(), dir).string()] = ss.str();
  }
  return m;
}

}  // namespace

// A NaN in one weight before step 2 with max_skipped_steps 2: steps 2 and 3 are skipped and step 3, the second in a
// row, stops training with an error naming the parameter (step 4 never runs); each skipped step's line names its
// global step and the parameter.
TEST(NonFinite, NanInAWeightStopsAtMaxSkippedStepsNamingTheParameter) {
  TmpDir t;
  NanInjection nan;
  nan.at = 2;
  const Outcome o = run_caught(tiny_config(t.p, {"max_skipped_steps=2"}), nan.hooks());
  ASSERT_FALSE(o.error.empty()) << "training finished despite a NaN weight:\n" << o.out;
  EXPECT_EQ(nan.steps, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(has(o.error, "training stopped at step 3: 2 steps in a row (steps 2..3) had a non-finite gradient "
                           "norm, reaching max_skipped_steps (2); first non-finite (step 2): "))
      << o.error;
  EXPECT_TRUE(has(o.error, std::string("first non-finite (step 2): parameter ") + kBadTensor +
                               " (NaN in the weights: 1 of "))
      << o.error;
  EXPECT_TRUE(has(o.error, "No checkpoint was written after step 1; there is no earlier checkpoint to resume from."))
      << o.error;
  EXPECT_TRUE(has(o.error, "What to try: check the weights named above")) << o.error;
  EXPECT_TRUE(has(o.error, "the model or checkpoint they were loaded from (tiny-qwen2)")) << o.error;
  for (int step : {2, 3})
    EXPECT_TRUE(has(o.out, fmt::format("step {}: non-finite gradient norm (nan); loss nan (non-finite); first "
                                       "non-finite: parameter {} (NaN in the weights: 1 of ",
                                       step, kBadTensor)))
        << o.out;
  EXPECT_TRUE(has(o.out, "update skipped (1 in a row; max_skipped_steps 2)")) << o.out;
  EXPECT_TRUE(has(o.out, "update skipped (2 in a row; max_skipped_steps 2)")) << o.out;
  EXPECT_FALSE(has(o.out, "step 4:")) << o.out;
  EXPECT_FALSE(has(o.out, "training done")) << o.out;
  EXPECT_TRUE(list_checkpoints(t.p).empty());  // no final save
  const auto events = records(t.p, "nonfinite");
  ASSERT_EQ(events.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(events[i]["step"], int64_t(i) + 2);
    EXPECT_EQ(events[i]["parameter"], kBadTensor);
  }
  const auto train_lines = records(t.p, "train");
  ASSERT_EQ(train_lines.size(), 3u);
  EXPECT_FALSE(train_lines[0].contains("update_skipped"));
  EXPECT_EQ(train_lines[2]["update_skipped"], true);
  EXPECT_EQ(train_lines[2]["skipped_steps"], 2);
}

// max_skipped_steps 0 and 1: the first non-finite step stops training (step 4 never runs).
TEST(NonFinite, MaxSkippedStepsZeroAndOneStopAtTheFirst) {
  for (const int64_t max : {0, 1}) {
    SCOPED_TRACE(max);
    TmpDir t(std::to_string(max));
    NanInjection nan;
    nan.at = 3;
    const Outcome o = run_caught(tiny_config(t.p, {fmt::format("max_skipped_steps={}", max)}), nan.hooks());
    EXPECT_EQ(nan.steps, (std::vector<int64_t>{1, 2, 3}));
    EXPECT_TRUE(has(o.error, fmt::format("training stopped at step 3: 1 step in a row (step 3) had a non-finite "
                                         "gradient norm, reaching max_skipped_steps ({}",
                                         max)))
        << o.error;
    EXPECT_TRUE(has(o.error, kBadTensor)) << o.error;
    EXPECT_TRUE(has(o.out, "step 3: non-finite gradient norm (nan)")) << o.out;
    EXPECT_TRUE(list_checkpoints(t.p).empty());
  }
}

// The last good checkpoint is left byte for byte, and nothing newer is written although save_steps falls on the
// skipped steps; the error says to resume from it. A resumed run that is non-finite from its first step names the
// checkpoint it resumed from as the holder of the non-finite weights.
TEST(NonFinite, LastGoodCheckpointIsUntouched) {
  TmpDir t;
  TrainHooks quiet;
  quiet.install_signal_handlers = false;
  run_training(tiny_config(t.p, {"max_steps=2", "save_steps=2"}), quiet);
  ASSERT_TRUE(is_complete_checkpoint(checkpoint_path(t.p, 2)));
  const auto before2 = tree_bytes(checkpoint_path(t.p, 2));
  // Resumed: step 3 trains and is saved, the NaN comes before step 4, steps 4 and 5 are non-finite.
  NanInjection nan;
  nan.at = 4;
  std::map<std::string, std::string> before3;
  TrainHooks h = nan.hooks();
  h.before_step = [&, inject = h.before_step](int64_t step, HostState& st, const ModelLayout& layout) {
    if (step == 4) before3 = tree_bytes(checkpoint_path(t.p, 3));
    inject(step, st, layout);
  };
  const std::vector<std::string> ov = {"save_steps=1", "max_skipped_steps=2", "resume_from_checkpoint=auto"};
  const Outcome o = run_caught(tiny_config(t.p, ov), h);
  EXPECT_EQ(nan.steps, (std::vector<int64_t>{3, 4, 5}));
  const fs::path good = checkpoint_path(t.p, 3);
  EXPECT_TRUE(has(o.error, "training stopped at step 5: 2 steps in a row (steps 4..5)")) << o.error;
  EXPECT_TRUE(has(o.error, "No checkpoint was written after step 3; the last good checkpoint is " + good.string()))
      << o.error;
  EXPECT_TRUE(has(o.error, "Resume from the last good checkpoint with: lazytrain train")) << o.error;
  EXPECT_TRUE(has(o.error, "resume_from_checkpoint=" + good.string())) << o.error;
  const auto cks = list_checkpoints(t.p);
  ASSERT_EQ(cks.size(), 2u);
  EXPECT_EQ(cks[0].step, 2);
  EXPECT_EQ(cks[1].step, 3);
  ASSERT_FALSE(before3.empty());
  EXPECT_EQ(tree_bytes(good), before3);
  EXPECT_EQ(tree_bytes(checkpoint_path(t.p, 2)), before2);
  for (const auto& e : fs::directory_iterator(t.p))
    EXPECT_FALSE(has(e.path().filename().string(), ".tmp-checkpoint")) << e.path();

  // Resumed from checkpoint 3 with the NaN before its first step: that checkpoint is named as their source.
  NanInjection again;
  again.at = 4;
  const Outcome o2 = run_caught(tiny_config(t.p, ov), again.hooks());
  EXPECT_TRUE(has(o2.error, "the last checkpoint, " + good.string() + ", holds the non-finite weights")) << o2.error;
  EXPECT_FALSE(has(o2.error, "Resume from the last good checkpoint")) << o2.error;
  EXPECT_EQ(list_checkpoints(t.p).size(), 2u);
  EXPECT_EQ(tree_bytes(good), before3);
}

// Two skipped steps (the NaN taken out again before step 5), fewer in a row than max_skipped_steps (3): training
// finishes, the summary,
// the result and the checkpoint's trainer state count them, and the checkpoint reads back (the skipped steps' NaN
// losses are JSON nulls).
TEST(NonFinite, TransientSkippedStepsAreCountedInTheSummary) {
  TmpDir t;
  NanInjection nan;
  nan.at = 3;
  nan.until = 5;
  const Outcome o = run_caught(tiny_config(t.p), nan.hooks());
  ASSERT_EQ(o.error, "");
  EXPECT_EQ(o.result.global_step, 6);
  EXPECT_EQ(o.result.skipped_steps, 2);
  ASSERT_EQ(o.result.losses.size(), 6u);
  EXPECT_TRUE(std::isnan(o.result.losses[2]) && std::isnan(o.result.losses[3]));
  EXPECT_TRUE(std::isfinite(o.result.losses[4]) && std::isfinite(o.result.losses[5]));
  EXPECT_TRUE(has(o.out, "step 3: non-finite gradient norm")) << o.out;
  EXPECT_TRUE(has(o.out, "step 4: non-finite gradient norm")) << o.out;
  EXPECT_TRUE(has(o.out, "update skipped (2 in a row; max_skipped_steps 3)")) << o.out;
  EXPECT_TRUE(has(o.out, "training done: 6 steps in ")) << o.out;
  EXPECT_TRUE(has(o.out, "; 2 steps skipped (non-finite gradient norm)\n")) << o.out;
  const TrainerState s = read_trainer_state(checkpoint_path(t.p, 6));
  EXPECT_EQ(s.skipped_steps, 2);
  ASSERT_EQ(s.losses.size(), 6u);
  EXPECT_TRUE(std::isnan(s.losses[2]));
  EXPECT_EQ(s.losses[5], o.result.losses[5]);
}

// A run whose last steps were skipped (2 in a row, fewer than max_skipped_steps 3) fails instead of saving that state
// as its final checkpoint.
TEST(NonFinite, RunEndingInSkippedStepsFailsWithoutAFinalSave) {
  TmpDir t;
  NanInjection nan;
  nan.at = 5;
  const Outcome o = run_caught(tiny_config(t.p), nan.hooks());
  EXPECT_TRUE(has(o.error, "training ended at step 6 after 2 steps in a row (steps 5..6) with a non-finite gradient "
                           "norm; the final state is not saved"))
      << o.error;
  EXPECT_FALSE(has(o.out, "training done")) << o.out;
  EXPECT_TRUE(list_checkpoints(t.p).empty());
}

// A stop request (as a signal) during non-finite steps stops without a checkpoint of that state and names the last
// good one.
TEST(NonFinite, StopRequestDuringSkippedStepsSavesNothing) {
  TmpDir t;
  NanInjection nan;
  nan.at = 3;
  TrainHooks h = nan.hooks();
  h.stop_after_steps = 3;
  const Outcome o = run_caught(tiny_config(t.p, {"save_steps=2"}), h);
  EXPECT_EQ(o.error, "");
  EXPECT_TRUE(o.result.interrupted);
  EXPECT_EQ(o.result.skipped_steps, 1);
  EXPECT_TRUE(has(o.out, "training stopped after step 3/6; no checkpoint saved: the last step was non-finite.\n"
                         "Resume from the last good checkpoint with: lazytrain train"))
      << o.out;
  const auto cks = list_checkpoints(t.p);
  ASSERT_EQ(cks.size(), 1u);
  EXPECT_EQ(cks[0].step, 2);
}

// Hooks that set the first 64 values of a parameter to v before step 2.
TrainHooks huge_weights(const std::string& name, float v) {
  TrainHooks h;
  h.install_signal_handlers = false;
  h.before_step = [name, v](int64_t step, HostState& st, const ModelLayout& layout) {
    if (step != 2) return;
    for (int64_t i = 0; i < 64; ++i) set_weight(st, layout, name, i, v);
  };
  return h;
}

// Finite but huge norm weights overflow in the forward: no parameter is named; the gradient's first non-finite unit
// in backward order is, and the non-finite loss says the forward produced it.
TEST(NonFinite, OverflowWithFiniteWeightsNamesTheGradient) {
  TmpDir t;
  const Outcome o = run_caught(tiny_config(t.p, {"max_skipped_steps=0"}),
                               huge_weights("model.layers.0.input_layernorm.weight", 1e20f));
  EXPECT_TRUE(has(o.error, "first non-finite (step 2): gradient of the head, the first in backward order "
                           "(non-finite: the head, layers 1..0, the embedding); the loss is non-finite, so the forward "
                           "pass produced it (the weights are finite)"))
      << o.error << o.out;
  EXPECT_FALSE(has(o.error, "parameter")) << o.error;
  EXPECT_TRUE(has(o.error, "What to try: lower learning_rate (now 0.002) or add warmup_steps; check the data of step 2"))
      << o.error;
  EXPECT_TRUE(has(o.error, "training stopped at step 2: 1 step in a row (step 2) had a non-finite gradient norm, "
                           "reaching max_skipped_steps (0: the first one stops training)"))
      << o.error;
  EXPECT_TRUE(has(o.error, "a larger max_skipped_steps (now 0) lets training ride out short runs of non-finite steps "
                           "(the step that makes max_skipped_steps in a row stops it)"))
      << o.error;
}

// Huge finite weights leave the loss finite and make the gradient norm huge, clipped every step: the run warns once, at
// the first such step, naming the largest weight, records the event, and trains on. The tied embedding's row 0 at 1e8
// gives that logit ~1e9 wherever the hidden state points its way: the softmax saturates there and the gradient of every
// hidden state before it is ~1e8 (a q_proj at 1e30 saturates the attention instead, whose gradient then cancels to
// zero or not depending on how the build rounds the softmax).
TEST(NonFinite, ExtremeGradientsFromHugeWeightsAreNamed) {
  TmpDir t;
  const Outcome o = run_caught(tiny_config(t.p, {"max_steps=4"}),
                               huge_weights("model.embed_tokens.weight", 1e8f));
  EXPECT_TRUE(o.error.empty()) << o.error;
  const auto ev = records(t.p, "extreme_gradients");
  ASSERT_EQ(ev.size(), 1u) << o.out;
  EXPECT_EQ(ev[0]["step"], 2);
  EXPECT_GT(ev[0]["grad_norm"].get<double>(), 1e6);
  EXPECT_EQ(ev[0]["largest_parameter"], "model.embed_tokens.weight");
  EXPECT_FLOAT_EQ(ev[0]["max_abs"].get<float>(), 1e8f);
  EXPECT_TRUE(has(o.out, "warning: step 2: gradient norm ")) << o.out;
  EXPECT_TRUE(has(o.out, "beyond any trained model's (clipped to 1)")) << o.out;
  EXPECT_TRUE(has(o.out, "the largest is model.embed_tokens.weight (|w| up to 1e+08)")) << o.out;
  EXPECT_EQ(records(t.p, "train").size(), 4u);
  // Every weight zero (the hidden states are zero, so is every gradient): the exact zero is named too.
  TmpDir z("_zero");
  TrainHooks zero;
  zero.install_signal_handlers = false;
  zero.before_step = [](int64_t step, HostState& st, const ModelLayout&) {
    if (step != 2) return;
    for (int64_t u = 0; u < st.units(); ++u) {
      std::vector<float> w(size_t(st.numel(u)), 0.0f);
      st.write_master(u, w.data());
    }
  };
  const Outcome oz = run_caught(tiny_config(z.p, {"max_steps=3"}), zero);
  const auto zev = records(z.p, "extreme_gradients");
  ASSERT_EQ(zev.size(), 1u) << oz.out << oz.error;
  EXPECT_EQ(zev[0]["grad_norm"].get<double>(), 0.0);
  EXPECT_TRUE(has(oz.out, "warning: step 2: every gradient is exactly zero: the step carries no signal")) << oz.out;
  EXPECT_TRUE(has(oz.out, "the largest weight is ")) << oz.out;
  // An ordinary run says nothing of the kind.
  TmpDir plain("_plain");
  TrainHooks quiet;
  quiet.install_signal_handlers = false;
  const Outcome ok = run_caught(tiny_config(plain.p, {"max_steps=4"}), quiet);
  EXPECT_TRUE(records(plain.p, "extreme_gradients").empty());
  EXPECT_FALSE(has(ok.out, "beyond any trained model's")) << ok.out;
}

// A non-finite loss with a finite gradient norm (the update was applied before the loss was known) is reported and
// counts toward max_skipped_steps as well: step 3, the second in a row, stops training (max_skipped_steps 2).
TEST(NonFinite, NonFiniteLossWithAFiniteNormIsReportedAndStopsToo) {
  TmpDir t;
  const Outcome o =
      run_caught(tiny_config(t.p, {"max_skipped_steps=2"}), huge_weights("model.embed_tokens.weight", 3e38f));
  EXPECT_TRUE(has(o.out, "step 2: non-finite loss (inf) with a finite gradient norm (")) << o.out;
  EXPECT_TRUE(has(o.out, "first non-finite: the forward pass (the loss is non-finite; the weights and the gradients "
                         "are finite); update applied (1 non-finite in a row; max_skipped_steps 2)"))
      << o.out;
  EXPECT_TRUE(has(o.error, "training stopped at step 3: 2 steps in a row (steps 2..3) had a non-finite loss or "
                           "gradient norm, reaching max_skipped_steps (2)"))
      << o.error;
  EXPECT_FALSE(has(o.out, "step 4:")) << o.out;
}

TEST(NonFinite, DiagnosisTexts) {
  const ModelLayout layout = model_layout(preset_config("tiny-qwen2"));  // units: embedding, layers 0..1, head
  NonFiniteStep s;
  s.step = 7;
  s.grad_norm = std::numeric_limits<double>::infinity();
  s.loss = 2.31;
  s.units = {0, 1, 2, 3};
  s.skipped = true;
  EXPECT_EQ(nonfinite_step_message(s, layout, 1, 3),
            "step 7: non-finite gradient norm (inf); loss 2.31 (finite); first non-finite: gradient of the head, the "
            "first in backward order (non-finite: the head, layers 1..0, the embedding); the loss is finite, so the "
            "backward pass produced it; update skipped (1 in a row; max_skipped_steps 3)");
  s.loss = std::numeric_limits<double>::quiet_NaN();
  s.units = {1};
  EXPECT_EQ(first_nonfinite_text(s, layout),
            "gradient of layer 0, the first in backward order (non-finite: layer 0); the loss is non-finite, so the "
            "forward pass produced it (the weights are finite)");
  s.parameter = NonFiniteParameter{"model.layers.1.mlp.down_proj.weight", 0, 2, 8192};
  EXPECT_EQ(first_nonfinite_text(s, layout),
            "parameter model.layers.1.mlp.down_proj.weight (Inf in the weights: 2 of 8192 values)");
  // The step that makes max_skipped_steps in a row reaches the limit; 0 and 1 both stop at the first.
  NonFiniteStreak streak(2);
  streak.record(4, true, true);
  EXPECT_FALSE(streak.reached_limit());
  streak.record(5, true, false);
  EXPECT_TRUE(streak.reached_limit());
  EXPECT_FALSE(streak.all_skipped());
  EXPECT_EQ(streak.first_step(), 4);
  streak.record(6, false, false);
  EXPECT_EQ(streak.length(), 0);
  EXPECT_FALSE(streak.reached_limit());
  for (const int64_t max : {0, 1}) {
    NonFiniteStreak first(max);
    EXPECT_FALSE(first.reached_limit());
    first.record(2, true, true);
    EXPECT_TRUE(first.reached_limit()) << max;
  }
  NonFiniteStreak three(3);
  three.record(1, true, true);
  three.record(2, true, true);
  EXPECT_FALSE(three.reached_limit());
  three.record(3, true, true);
  EXPECT_TRUE(three.reached_limit());

  NonFiniteStop stop;
  stop.step = 3;
  stop.first_step = 2;
  stop.max_skipped_steps = 2;
  stop.first_nonfinite = "the forward pass";
  stop.learning_rate = 1e-3;
  EXPECT_EQ(nonfinite_stop_message(stop).substr(0, nonfinite_stop_message(stop).find('\n')),
            "training stopped at step 3: 2 steps in a row (steps 2..3) had a non-finite gradient norm, reaching "
            "max_skipped_steps (2); first non-finite (step 2): the forward pass.");
  EXPECT_TRUE(has(nonfinite_stop_message(stop),
                  "What to try: lower learning_rate (now 0.001) or add warmup_steps; check the data of steps 2..3; a "
                  "larger max_skipped_steps (now 2) lets training ride out short runs of non-finite steps (the step "
                  "that makes max_skipped_steps in a row stops it)."))
      << nonfinite_stop_message(stop);
  EXPECT_EQ(nonfinite_peer_stop_message(stop),
            "training stopped at step 3 with every rank: 2 steps in a row (steps 2..3) had a non-finite gradient "
            "norm, reaching max_skipped_steps (2); rank 0's output says where it first appeared");
  stop.run_ended = true;
  EXPECT_TRUE(has(nonfinite_stop_message(stop), "training ended at step 3 after 2 steps in a row (steps 2..3) with a "
                                                "non-finite gradient norm; the final state is not saved;"))
      << nonfinite_stop_message(stop);
  stop.run_ended = false;
  stop.step = stop.first_step = 5;
  stop.max_skipped_steps = 0;
  stop.all_skipped = false;
  EXPECT_EQ(nonfinite_peer_stop_message(stop),
            "training stopped at step 5 with every rank: 1 step in a row (step 5) had a non-finite loss or gradient "
            "norm, reaching max_skipped_steps (0: the first one stops training); rank 0's output says where it first "
            "appeared");
}

// Two data-parallel ranks (processes with the shared-memory communicator, as `lazytrain launch -n 2` runs them) with
// the same NaN before step 2 and max_skipped_steps 2: both stop with an error after step 3; rank 0's names the
// parameter.
TEST(NonFinite, DataParallelRanksStopTogether) {
  TmpDir t;
  const fs::path rdzv = t.p / "rdzv";
  fs::create_directories(rdzv);
  const TrainConfig cfg = tiny_config(t.p / "out", {"max_skipped_steps=2", "backend=cpu"});
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("LT_WORLD_SIZE", "2", 1);
      ::setenv("LT_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LT_LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LT_RDZV_DIR", rdzv.c_str(), 1);
      ::setenv("LT_COMM_TIMEOUT_S", "60", 1);
      int code = 0;
      std::string msg = "finished";
      try {
        NanInjection nan;
        nan.at = 2;
        run_training(cfg, nan.hooks());
      } catch (const Error& e) {
        code = 1;
        msg = e.what();
      } catch (const std::exception& e) {
        code = 3;
        msg = e.what();
      }
      std::ofstream(t.p / fmt::format("rank{}.txt", r)) << msg;
      std::fflush(stdout);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(2, -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  for (int r = 0; r < 2; ++r) {
    int st = 0;
    while (::waitpid(pids[size_t(r)], &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pids[size_t(r)], SIGKILL);
        ::waitpid(pids[size_t(r)], &st, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    codes[size_t(r)] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  auto message = [&](int r) {
    std::ifstream f(t.p / fmt::format("rank{}.txt", r));
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  EXPECT_EQ(codes, (std::vector<int>{1, 1})) << message(0) << "\n" << message(1);
  EXPECT_TRUE(has(message(0), "training stopped at step 3: 2 steps in a row (steps 2..3) had a non-finite gradient "
                              "norm, reaching max_skipped_steps (2)"))
      << message(0);
  EXPECT_TRUE(has(message(0), kBadTensor)) << message(0);
  EXPECT_TRUE(has(message(1), "training stopped at step 3 with every rank: 2 steps in a row (steps 2..3) had a "
                              "non-finite gradient norm, reaching max_skipped_steps (2); rank 0's output says"))
      << message(1);
  EXPECT_TRUE(list_checkpoints(t.p / "out").empty());
}

