// Packed rows (docs/planner.md "Packed rows"): the attention core's share of an attention layer's time scales with the
// data's attention fraction (packed_layer_times); fraction 1 is today's prediction exactly; nothing else changes.
#include <gtest/gtest.h>

#include "../common/repo_path.h"
#include "core/error.h"
#include "model/accounting.h"
#include "model/model_config.h"
#include "plan/instance.h"
#include "plan/planner.h"
#include "plan/profile.h"
#include "plan/report.h"

using namespace lt;

namespace {

// Round rates: GEMMs at 1 TFLOP/s, attention at 0.25 TFLOP/s.
ResourceProfile round_profile() {
  ResourceProfile p = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h200.json");
  p.layer_timings.clear();
  p.gemm_flops = 1e12;
  p.attn_flops = 0.25e12;
  return p;
}

// tiny-qwen3: q_dim 4 heads x 32 = 128. Causal attention forward: QK^T and PV, 2 * 2 * B * S^2 * Q, half of it.
double attention_fwd_flops(int64_t batch, int64_t seq) { return 2.0 * double(batch) * double(seq * seq) * 128.0; }

TEST(PackedRows, EstimateScalesOnlyTheAttentionCore) {
  const ModelConfig c = preset_config("tiny-qwen3");
  const ResourceProfile p = round_profile();
  const LayerTimes full = layer_times(p, c, LayerKind::Attention, 2, 64);
  const LayerTimes one = packed_layer_times(p, c, LayerKind::Attention, 2, 64, 0, 1.0);
  EXPECT_EQ(one.fwd_s, full.fwd_s);  // fraction 1: today's prediction, bit for bit
  EXPECT_EQ(one.bwd_s, full.bwd_s);
  // By hand: the matmuls at 1 TFLOP/s plus f x the attention core at 0.25 TFLOP/s; the backward 2x the forward.
  const double core_s = attention_fwd_flops(2, 64) / 0.25e12;
  const double mm_s = (layer_cost(c, LayerKind::Attention, 2, 64).flops_fwd - attention_fwd_flops(2, 64)) / 1e12;
  EXPECT_NEAR(full.fwd_s, mm_s + core_s, 1e-15);
  const LayerTimes quarter = packed_layer_times(p, c, LayerKind::Attention, 2, 64, 0, 0.25);
  EXPECT_NEAR(quarter.fwd_s, mm_s + 0.25 * core_s, 1e-15);
  EXPECT_NEAR(quarter.bwd_s, 2.0 * (mm_s + 0.25 * core_s), 1e-15);
  EXPECT_FALSE(quarter.measured);
}

TEST(PackedRows, MeasuredTimingLosesTheAttentionShareOnly) {
  const ModelConfig c = preset_config("tiny-qwen3");
  ResourceProfile p = round_profile();
  LayerTiming t = layer_timing_for(c, LayerKind::Attention, 2, 64, 1e-3, 3e-3);
  t.bwd_kept_s = 2e-3;
  t.keep_bytes = 1 << 20;
  p.layer_timings.push_back(t);
  p.attn_flops = attention_fwd_flops(2, 64) / 0.2e-3;  // the attention core's forward: 0.2 ms
  const LayerTimes one = packed_layer_times(p, c, LayerKind::Attention, 2, 64, 0, 1.0);
  EXPECT_EQ(one.fwd_s, 1e-3);
  EXPECT_EQ(one.bwd_s, 3e-3);
  // Half the square: forward 0.1 ms less; backwards 2.5 x 0.1 ms less (the profiler's 3.5x forward + backward).
  const LayerTimes half = packed_layer_times(p, c, LayerKind::Attention, 2, 64, 0, 0.5);
  EXPECT_TRUE(half.measured);
  EXPECT_NEAR(half.fwd_s, 0.9e-3, 1e-15);
  EXPECT_NEAR(half.bwd_s, 2.75e-3, 1e-15);
  EXPECT_NEAR(half.bwd_kept_s, 1.75e-3, 1e-15);
  EXPECT_EQ(half.keep_bytes, double(1 << 20));
  // An attention rate too slow for the timing: the share is at most the measured time.
  p.attn_flops = attention_fwd_flops(2, 64) / 1.0;
  const LayerTimes capped = packed_layer_times(p, c, LayerKind::Attention, 2, 64, 0, 0.5);
  EXPECT_NEAR(capped.fwd_s, 0.5e-3, 1e-15);
  EXPECT_NEAR(capped.bwd_s, 1.5e-3, 1e-15);
}

TEST(PackedRows, DeltaNetLayersAreUnchanged) {
  const ModelConfig c = preset_config("tiny-qwen35");
  const ResourceProfile p = round_profile();
  const LayerTimes full = layer_times(p, c, LayerKind::GatedDeltaNet, 2, 64);
  const LayerTimes packed = packed_layer_times(p, c, LayerKind::GatedDeltaNet, 2, 64, 0, 0.1);
  EXPECT_EQ(packed.fwd_s, full.fwd_s);
  EXPECT_EQ(packed.bwd_s, full.bwd_s);
}

TEST(PackedRows, FractionOutsideZeroToOneIsAnError) {
  const ModelConfig c = preset_config("tiny-qwen3");
  const ResourceProfile p = round_profile();
  for (double f : {0.0, -0.5, 1.5}) {
    try {
      packed_layer_times(p, c, LayerKind::Attention, 2, 64, 0, f);
      ADD_FAILURE() << "fraction " << f << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("attention fraction"), std::string::npos) << e.what();
    }
  }
}

PlanRequest tiny_request(double fraction) {
  PlanRequest r;
  r.model = preset_config("tiny-qwen3");
  r.batch = 2;
  r.seq = 64;
  r.profile = round_profile();
  r.planner = "dp";
  r.compare = false;
  r.attention_fraction = fraction;
  return r;
}

TEST(PackedRows, PlanWithFractionOneIsTodaysAndAFractionChangesOnlyTheAttentionShare) {
  const PlanRequest base = tiny_request(1.0);
  PlanRequest today = base;
  today.attention_fraction = PlanRequest{}.attention_fraction;  // the default: 1
  const PlanOutcome a = make_plan(base), b = make_plan(today);
  ASSERT_TRUE(a.feasible);
  EXPECT_EQ(a.sim.pred.step_s, b.sim.pred.step_s);
  EXPECT_EQ(packed_rows_line(base), "");
  const PlanOutcome q = make_plan(tiny_request(0.25));
  ASSERT_TRUE(q.feasible);
  const double core_s = attention_fwd_flops(2, 64) / 0.25e12;
  for (int j = 0; j < a.inst.L; ++j) {
    EXPECT_NEAR(q.inst.rho[size_t(j)], a.inst.rho[size_t(j)] - 0.75 * core_s, 1e-15) << "layer " << j;
    // beta = forward + backward: 3x the forward's share.
    EXPECT_NEAR(q.inst.beta[size_t(j)], a.inst.beta[size_t(j)] - 3 * 0.75 * core_s, 1e-15) << "layer " << j;
    EXPECT_EQ(q.inst.P[size_t(j)], a.inst.P[size_t(j)]);
    EXPECT_EQ(q.inst.ws_bwd[size_t(j)], a.inst.ws_bwd[size_t(j)]);
  }
  EXPECT_EQ(q.inst.head_s, a.inst.head_s);
  EXPECT_LT(q.sim.pred.step_s, a.sim.pred.step_s);
  // The attention-inclusive FLOPs count the segments' squares.
  const double attn_step = 3.0 * 2.0 * attention_fwd_flops(2, 64);  // 2 layers, forward + backward
  EXPECT_NEAR(a.flops_attn_per_step - q.flops_attn_per_step, 0.75 * attn_step, 1e-6 * attn_step);
  EXPECT_NE(plan_report(tiny_request(0.25), q).find("packed rows: the attention core's share of each attention "
                                                     "layer's time scaled by 0.2500"),
            std::string::npos);
}

}  // namespace
