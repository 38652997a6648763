// Hybrid models (attention + Gated DeltaNet layers): the planner's per-layer quantities come from each
// layer's kind, measured timings match by kind, and the DP, the MILP and the simulator agree.
#include "../common/repo_path.h"
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "model/accounting.h"
#include "plan/milp.h"
#include "plan/planner.h"
#include "plan/report.h"
#include "plan_test_util.h"

namespace lt {
namespace {

ResourceProfile h200() { return load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h200.json"); }

// The estimate from the accounting: matmuls at the GEMM rate, the mixer core at its kind's rate.
double expected_fwd(const ResourceProfile& p, const ModelConfig& c, int64_t j, int64_t batch, int64_t seq) {
  const auto lc = layer_cost_at(c, j, batch, seq);
  const double core_rate = c.kind(j) == LayerKind::GatedDeltaNet && p.scan_flops > 0 ? p.scan_flops : p.attn_flops;
  return (lc.flops_fwd - lc.flops_core_fwd) / p.gemm_flops + lc.flops_core_fwd / core_rate;
}

void expect_per_layer_instance(const ModelConfig& c, int64_t batch, int64_t chunk, int64_t seq) {
  SCOPED_TRACE(c.name);
  const auto prof = h200();
  InstanceOptions o;
  o.chunk = chunk;
  const Instance in = make_instance(c, batch, seq, prof, o);
  ASSERT_EQ(in.L, c.layers);
  double Pmax = 0;
  for (int j = 0; j < in.L; ++j) Pmax = std::max(Pmax, 2.0 * double(layer_cost_at(c, j, batch, seq).params));
  EXPECT_DOUBLE_EQ(in.ring, 2 * Pmax);
  for (int j = 0; j < in.L; ++j) {
    SCOPED_TRACE(j);
    const auto full = layer_cost_at(c, j, batch, seq), part = layer_cost_at(c, j, chunk, seq);
    EXPECT_EQ(in.kind_of(j), c.kind(j));
    EXPECT_DOUBLE_EQ(in.P[size_t(j)], 2.0 * double(full.params));
    EXPECT_DOUBLE_EQ(in.G[size_t(j)], 4.0 * double(full.params));  // fp32 gradients down
    EXPECT_DOUBLE_EQ(in.A, double(full.boundary_bytes));
    EXPECT_DOUBLE_EQ(in.ws_fwd[size_t(j)], double(part.workspace_bytes));
    EXPECT_DOUBLE_EQ(in.ws_bwd[size_t(j)], double(part.internal_bytes + part.workspace_bytes) + 2 * in.A);
    EXPECT_NEAR(in.rho[size_t(j)], expected_fwd(prof, c, j, batch, seq), 1e-12 * in.rho[size_t(j)]);
    EXPECT_NEAR(in.beta[size_t(j)], 3 * in.rho[size_t(j)], 1e-12 * in.beta[size_t(j)]);
    EXPECT_NEAR(in.opt[size_t(j)], double(full.params) / prof.opt_fp32_params_per_s / optimizer_derate(in, prof),
                1e-9 * in.opt[size_t(j)]);
  }
  // The two kinds really differ in every per-layer quantity.
  int a = -1, d = -1;
  for (int j = 0; j < in.L; ++j) (c.kind(j) == LayerKind::Attention ? a : d) = j;
  ASSERT_GE(a, 0);
  ASSERT_GE(d, 0);
  for (auto* v : {&in.P, &in.rho, &in.beta, &in.ws_bwd, &in.opt})
    EXPECT_GT(std::abs((*v)[size_t(a)] - (*v)[size_t(d)]), 1e-3 * (*v)[size_t(a)]);
}

TEST(PlanHybrid, InstancePerLayerMatchesAccounting) {
  expect_per_layer_instance(preset_config("tiny-qwen35"), 4, 2, 64);
  expect_per_layer_instance(preset_config("qwen3.6-27b"), 8, 4, 1024);
  // A random order of kinds (not Qwen3.5's 3:1 pattern).
  std::mt19937 rng(3);
  ModelConfig c = preset_config("tiny-qwen35");
  c.layers = 9;
  c.layer_kinds = test::test_kinds(rng, 9, true);
  c.name = "tiny-qwen35 random order";
  expect_per_layer_instance(c, 4, 4, 64);
}

TEST(PlanHybrid, HomogeneousInstanceUnchanged) {
  // Every layer alike: one value per quantity, the ring two of them.
  const auto c = preset_config("qwen2.5-7b");
  const Instance in = make_instance(c, 8, 1024, h200(), {});
  const auto lc = layer_cost(c, 8, 1024);
  for (int j = 0; j < in.L; ++j) {
    EXPECT_DOUBLE_EQ(in.P[size_t(j)], 2.0 * double(lc.params));
    EXPECT_DOUBLE_EQ(in.ws_bwd[size_t(j)], in.ws_bwd[0]);
    EXPECT_DOUBLE_EQ(in.rho[size_t(j)], in.rho[0]);
  }
  EXPECT_DOUBLE_EQ(in.ring, 2 * in.P[0]);
}

LayerTiming deltanet_timing(const ModelConfig& c, int64_t batch, int64_t seq, double fwd, double bwd) {
  return layer_timing_for(c, LayerKind::GatedDeltaNet, batch, seq, fwd, bwd);
}

TEST(PlanHybrid, MeasuredTimingsMatchByKind) {
  const auto c = preset_config("qwen3.5-9b");
  auto p = h200();
  p.layer_timings.push_back(deltanet_timing(c, 4, 1024, 0.010, 0.030));
  // The DeltaNet entry times the DeltaNet layers (scaled by the batch), not the attention layers.
  const auto d = layer_times(p, c, LayerKind::GatedDeltaNet, 8, 1024);
  EXPECT_TRUE(d.measured);
  EXPECT_DOUBLE_EQ(d.fwd_s, 0.020);
  EXPECT_DOUBLE_EQ(d.bwd_s, 0.060);
  const auto a = layer_times(p, c, LayerKind::Attention, 8, 1024);
  EXPECT_FALSE(a.measured);
  // Another linear shape, or another sequence, does not match.
  p.layer_timings.back().linear_v_heads += 1;
  EXPECT_FALSE(layer_times(p, c, LayerKind::GatedDeltaNet, 8, 1024).measured);
  p.layer_timings.back() = deltanet_timing(c, 4, 2048, 0.01, 0.03);
  EXPECT_FALSE(layer_times(p, c, LayerKind::GatedDeltaNet, 8, 1024).measured);
  // An attention entry of the model's attention shape times only the attention layers.
  p.layer_timings = {layer_timing_for(c, LayerKind::Attention, 8, 1024, 0.005, 0.009)};
  EXPECT_TRUE(layer_times(p, c, LayerKind::Attention, 8, 1024).measured);
  EXPECT_FALSE(layer_times(p, c, LayerKind::GatedDeltaNet, 8, 1024).measured);
  // The planner's instance takes each layer's time from its kind.
  const Instance in = make_instance(c, 8, 1024, p, {});
  for (int j = 0; j < in.L; ++j)
    if (c.kind(j) == LayerKind::Attention) EXPECT_DOUBLE_EQ(in.rho[size_t(j)], 0.005);
    else EXPECT_NEAR(in.rho[size_t(j)], expected_fwd(p, c, j, 8, 1024), 1e-15);
}

TEST(PlanHybrid, ChunkedPlansTakeThePerSampleTimeAtTheChunk) {
  const auto c = preset_config("qwen3.5-9b");
  auto p = h200();
  // Measured at 64 samples (10 / 30 ms per sample: 0.64 / 1.92 s) and at 1 sample (20 / 50 ms: the
  // small GEMMs' lower rate), as the GPU profiler does when the batch is above what one layer pass holds.
  p.layer_timings = {deltanet_timing(c, 64, 1024, 0.64, 1.92), deltanet_timing(c, 1, 1024, 0.020, 0.050)};
  const auto whole = layer_times(p, c, LayerKind::GatedDeltaNet, 1000, 1024);  // chunk 0: the batch's size
  EXPECT_NEAR(whole.fwd_s, 1000 * 0.010, 1e-12);  // above the largest: its per-sample time
  EXPECT_NEAR(whole.bwd_s, 1000 * 0.030, 1e-12);
  const auto one = layer_times(p, c, LayerKind::GatedDeltaNet, 1000, 1024, 1);
  EXPECT_NEAR(one.fwd_s, 1000 * 0.020, 1e-12);
  EXPECT_NEAR(one.bwd_s, 1000 * 0.050, 1e-12);
  const auto eight = layer_times(p, c, LayerKind::GatedDeltaNet, 1000, 1024, 8);  // log-midway between 1 and 64
  EXPECT_NEAR(eight.fwd_s, 1000 * 0.015, 1e-12);
  EXPECT_NEAR(eight.bwd_s, 1000 * 0.040, 1e-12);
  // A chunk of the whole batch is the unchunked case; one timing alone scales by the batch at every chunk.
  EXPECT_DOUBLE_EQ(layer_times(p, c, LayerKind::GatedDeltaNet, 1000, 1024, 1000).fwd_s, whole.fwd_s);
  p.layer_timings.pop_back();
  EXPECT_NEAR(layer_times(p, c, LayerKind::GatedDeltaNet, 1000, 1024, 1).fwd_s, 1000 * 0.010, 1e-12);
  // The planner's instance at a chunk takes the chunk's rate.
  p.layer_timings.push_back(deltanet_timing(c, 1, 1024, 0.020, 0.050));
  InstanceOptions o;
  o.chunk = 1;
  const Instance in = make_instance(c, 100, 1024, p, o);
  for (int j = 0; j < in.L; ++j)
    if (c.kind(j) == LayerKind::GatedDeltaNet) EXPECT_NEAR(in.rho[size_t(j)], 100 * 0.020, 1e-12);
}

TEST(PlanHybrid, ScanRateTimesTheDeltaRuleOnly) {
  const auto c = preset_config("qwen3.5-9b");
  auto p = h200();
  const auto a0 = layer_times(p, c, LayerKind::Attention, 8, 4096), d0 = layer_times(p, c, LayerKind::GatedDeltaNet, 8, 4096);
  p.scan_flops = p.attn_flops / 4;  // a slower delta-rule kernel
  const auto a1 = layer_times(p, c, LayerKind::Attention, 8, 4096), d1 = layer_times(p, c, LayerKind::GatedDeltaNet, 8, 4096);
  EXPECT_DOUBLE_EQ(a1.fwd_s, a0.fwd_s);
  const auto lc = layer_cost(c, LayerKind::GatedDeltaNet, 8, 4096);
  EXPECT_NEAR(d1.fwd_s - d0.fwd_s, lc.flops_core_fwd * (4 / p.attn_flops - 1 / p.attn_flops), 1e-12);
  EXPECT_NEAR(d1.bwd_s, 2 * d1.fwd_s, 1e-15);
}

TEST(PlanHybrid, ProfileJsonKindsAndScanRate) {
  const auto c = preset_config("qwen3.5-9b");
  auto p = h200();
  EXPECT_FALSE(profile_to_json(p).contains("scan_tflops"));  // absent stays absent
  p.scan_flops = 300e12;
  p.layer_timings = {deltanet_timing(c, 4, 1024, 0.01, 0.03)};
  auto j = profile_to_json(p);
  EXPECT_EQ(j["layer_timings"][0]["kind"], "linear_attention");
  EXPECT_DOUBLE_EQ(j["scan_tflops"].get<double>(), 300);
  auto q = profile_from_json(j, "rt");
  EXPECT_EQ(profile_to_json(q).dump(), j.dump());
  EXPECT_EQ(q.layer_timings[0].kind, LayerKind::GatedDeltaNet);
  EXPECT_EQ(q.layer_timings[0].linear_v_heads, c.linear.v_heads);
  // Old entries (no kind, no linear fields) load as attention timings.
  auto old = j;
  old["layer_timings"][0] = {{"hidden", 2048}, {"ffn", 11008}, {"heads", 16}, {"kv_heads", 2}, {"head_dim", 128},
                             {"batch", 8}, {"seq", 1024}, {"fwd_s", 0.002}, {"bwd_s", 0.004}};
  EXPECT_EQ(profile_from_json(old, "old").layer_timings[0].kind, LayerKind::Attention);
  // Strict: a DeltaNet entry needs its linear shape; unknown keys and kinds are errors.
  auto bad = j;
  bad["layer_timings"][0].erase("linear_v_heads");
  EXPECT_THROW(profile_from_json(bad, "x"), Error);
  bad = j;
  bad["layer_timings"][0]["extra"] = 1;
  EXPECT_THROW(profile_from_json(bad, "x"), Error);
  bad = j;
  bad["layer_timings"][0]["kind"] = "sliding_attention";
  EXPECT_THROW(profile_from_json(bad, "x"), Error);
  bad = j;
  bad["scan_tflops"] = 0;
  EXPECT_THROW(profile_from_json(bad, "x"), Error);
}

// The whole planner on a hybrid model: the DP's value is the simulator's (no optimizer waits), the
// DP's plan is a point of the MILP, the MILP's objective is the simulator's step for its plan, the
// chosen plan is never worse than the DP's; the report and the SVG name the kinds.
TEST(PlanHybrid, DpMilpSimulatorConsistentOnQwen35) {
  PlanRequest r;
  r.model = preset_config("qwen3.5-9b");
  r.batch = 16;
  r.seq = 1024;
  r.profile = h200();
  r.profile.hbm_bytes = 24 * GiB;
  r.profile.hbm_reserve = GiB;
  r.profile.dram_bytes = 256 * GiB;  // the 248k vocabulary's embedding and head state need more than h200's 112 GiB
  r.milp.time_limit_s = 20;
  auto o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  ASSERT_TRUE(o.dp && o.dp->feasible);
  ASSERT_TRUE(o.milp && o.milp->feasible);
  const Candidate* dp = nullptr;
  for (auto& cd : o.candidates)
    if (cd.name == "dp") dp = &cd;
  ASSERT_TRUE(dp && dp->feasible);
  EXPECT_NEAR(dp->sim.step_no_opt_s, o.dp->value, 1e-9 * o.dp->value);
  auto v = milp_check_plan(o.inst, dp->plan);
  EXPECT_TRUE(v.empty()) << v.front();
  Plan mp = dp->plan;
  apply_milp_solution(o.inst, *o.milp, mp);
  const auto ms = simulate(o.inst, mp);
  EXPECT_TRUE(ms.fits) << ms.violation;
  EXPECT_NEAR(ms.pred.step_s, o.milp->objective, 0.01 * o.milp->objective);
  EXPECT_LE(o.sim.pred.step_s, dp->sim.pred.step_s * (1 + 1e-9));
  const auto rep = plan_report(r, o);
  EXPECT_NE(rep.find("layers: 8 attention 24 deltanet"), std::string::npos) << rep;
  EXPECT_NE(rep.find("  deltanet  x24"), std::string::npos) << rep;
  EXPECT_NE(rep.find("      3  attention"), std::string::npos) << rep;
  EXPECT_NE(rep.find("      0  deltanet"), std::string::npos) << rep;
  const auto svg = timeline_svg(o.sim, "t");
  EXPECT_NE(svg.find("Gated DeltaNet layer (D)"), std::string::npos);
  EXPECT_NE(svg.find("F3 A"), std::string::npos);
}

}  // namespace
}  // namespace lt
