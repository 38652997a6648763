// Kept internals: the last k layers keep their forward internals in HBM for their backward
// (Plan::kept_layers). The profile's optional bwd_kept_s / keep_bytes, layer_times, the instance's beta_kept /
// keep_bytes and with_kept, the planner's search over k, and the plan JSON.
#include "../common/repo_path.h"
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "plan/planner.h"
#include "plan/report.h"
#include "plan_test_util.h"

namespace lt {
namespace {

using nlohmann::json;

ResourceProfile h200() { return load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h200.json"); }

// An attention timing of model c with the kept figures.
LayerTiming kept_timing(const ModelConfig& c, int64_t batch, int64_t seq, double fwd, double bwd, double bwd_kept,
                        int64_t keep_bytes) {
  LayerTiming t = layer_timing_for(c, LayerKind::Attention, batch, seq, fwd, bwd);
  t.bwd_kept_s = bwd_kept;
  t.keep_bytes = keep_bytes;
  return t;
}

void expect_error_naming(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- (a) profile JSON

TEST(PlanKept, ProfileJsonRoundTripWithAndWithoutKeptFields) {
  const auto c = preset_config("tiny-qwen3");
  auto p = h200();
  // Without them: not written, read back as 0 (older profiles load unchanged).
  p.layer_timings = {layer_timing_for(c, LayerKind::Attention, 4, 64, 0.01, 0.02)};
  json j = profile_to_json(p);
  EXPECT_FALSE(j["layer_timings"][0].contains("bwd_kept_s"));
  EXPECT_FALSE(j["layer_timings"][0].contains("keep_bytes"));
  auto q = profile_from_json(j, "old");
  EXPECT_EQ(q.layer_timings[0].bwd_kept_s, 0.0);
  EXPECT_EQ(q.layer_timings[0].keep_bytes, 0);
  EXPECT_EQ(profile_to_json(q).dump(), j.dump());
  // With them: written, read back equal.
  p.layer_timings = {kept_timing(c, 4, 64, 0.01, 0.02, 0.012, 3 * MiB)};
  j = profile_to_json(p);
  EXPECT_DOUBLE_EQ(j["layer_timings"][0]["bwd_kept_s"].get<double>(), 0.012);
  EXPECT_EQ(j["layer_timings"][0]["keep_bytes"].get<int64_t>(), 3 * MiB);
  q = profile_from_json(j, "new");
  EXPECT_DOUBLE_EQ(q.layer_timings[0].bwd_kept_s, 0.012);
  EXPECT_EQ(q.layer_timings[0].keep_bytes, 3 * MiB);
  EXPECT_EQ(profile_to_json(q).dump(), j.dump());
  // Negative values, and wrong types, are errors naming the field.
  auto bad = j;
  bad["layer_timings"][0]["keep_bytes"] = -1;
  expect_error_naming([&] { profile_from_json(bad, "x"); }, "'keep_bytes'");
  bad = j;
  bad["layer_timings"][0]["keep_bytes"] = 1.5;
  expect_error_naming([&] { profile_from_json(bad, "x"); }, "'keep_bytes'");
  bad = j;
  bad["layer_timings"][0]["bwd_kept_s"] = -0.5;
  expect_error_naming([&] { profile_from_json(bad, "x"); }, "'bwd_kept_s'");
  bad = j;
  bad["layer_timings"][0]["bwd_kept_s"] = "fast";
  expect_error_naming([&] { profile_from_json(bad, "x"); }, "'bwd_kept_s'");
}

// ---------------------------------------------------------------- (b) layer_times

TEST(PlanKept, LayerTimesInterpolatesKeptFigures) {
  const auto c = preset_config("tiny-qwen3");
  auto p = h200();
  // Per sample: at 64 samples fwd 10 / bwd 30 / kept 20 ms and 2 MiB; at 1 sample 20 / 50 / 40 ms and 4 MiB.
  p.layer_timings = {kept_timing(c, 64, 64, 0.64, 1.92, 1.28, 128 * MiB), kept_timing(c, 1, 64, 0.020, 0.050, 0.040, 4 * MiB)};
  const auto whole = layer_times(p, c, LayerKind::Attention, 1000, 64);  // above the largest: its per-sample figures
  EXPECT_NEAR(whole.bwd_kept_s, 1000 * 0.020, 1e-12);
  EXPECT_NEAR(whole.keep_bytes, 1000.0 * 2 * MiB, 1e-3);
  const auto one = layer_times(p, c, LayerKind::Attention, 1000, 64, 1);
  EXPECT_NEAR(one.bwd_kept_s, 1000 * 0.040, 1e-12);
  EXPECT_NEAR(one.keep_bytes, 1000.0 * 4 * MiB, 1e-3);
  const auto eight = layer_times(p, c, LayerKind::Attention, 1000, 64, 8);  // log-midway between 1 and 64
  EXPECT_NEAR(eight.fwd_s, 1000 * 0.015, 1e-12);
  EXPECT_NEAR(eight.bwd_kept_s, 1000 * 0.030, 1e-12);
  EXPECT_NEAR(eight.keep_bytes, 1000.0 * 3 * MiB, 1e-3);
  // A matching timing without them: 0 (no keeping), the times as before.
  p.layer_timings[1].bwd_kept_s = 0;
  const auto half = layer_times(p, c, LayerKind::Attention, 1000, 64, 8);
  EXPECT_EQ(half.bwd_kept_s, 0.0);
  EXPECT_NEAR(half.keep_bytes, 1000.0 * 3 * MiB, 1e-3);
  EXPECT_NEAR(half.fwd_s, eight.fwd_s, 1e-12);
  p.layer_timings[1].keep_bytes = 0;
  EXPECT_EQ(layer_times(p, c, LayerKind::Attention, 1000, 64, 8).keep_bytes, 0.0);
  // No matching timing (estimated from FLOPs): no keeping.
  p.layer_timings.clear();
  const auto est = layer_times(p, c, LayerKind::Attention, 1000, 64);
  EXPECT_FALSE(est.measured);
  EXPECT_EQ(est.bwd_kept_s, 0.0);
  EXPECT_EQ(est.keep_bytes, 0.0);
}

// ---------------------------------------------------------------- (c) instance

TEST(PlanKept, InstanceKeptFiguresAndWithKept) {
  auto c = preset_config("tiny-qwen3");
  c.layers = 6;
  auto p = h200();
  // 8 samples: fwd 10, bwd 20, kept 12 ms per sample, 1 MiB per sample kept.
  p.layer_timings = {kept_timing(c, 8, 64, 0.08, 0.16, 0.096, 8 * MiB)};
  InstanceOptions o;
  o.chunk = 2;  // the kept backward at the chunk's rate, keep_bytes for the whole batch
  const Instance in = make_instance(c, 8, 64, p, o);
  ASSERT_EQ(in.beta_kept.size(), 6u);
  ASSERT_EQ(in.keep_bytes.size(), 6u);
  EXPECT_EQ(in.kept, 0);
  for (int j = 0; j < 6; ++j) {
    EXPECT_NEAR(in.beta[size_t(j)], 0.24, 1e-12);
    EXPECT_NEAR(in.beta_kept[size_t(j)], 0.096, 1e-12);
    EXPECT_NEAR(in.keep_bytes[size_t(j)], double(8 * MiB), 1e-3);
  }
  EXPECT_EQ(keepable_tail(in), 6);
  EXPECT_EQ(kept_hbm(in), 0.0);
  const Instance k2 = with_kept(in, 2);
  EXPECT_EQ(k2.kept, 2);
  EXPECT_DOUBLE_EQ(k2.hbm_fixed, in.hbm_fixed + 2.0 * 8 * MiB);
  EXPECT_DOUBLE_EQ(kept_hbm(k2), 2.0 * 8 * MiB);
  for (int j = 0; j < 6; ++j)
    EXPECT_DOUBLE_EQ(k2.beta[size_t(j)], j >= 4 ? in.beta_kept[size_t(j)] : in.beta[size_t(j)]) << j;
  EXPECT_EQ(k2.rho, in.rho);
  EXPECT_EQ(k2.ws_bwd, in.ws_bwd);
  const Instance k0 = with_kept(in, 0);
  EXPECT_EQ(k0.beta, in.beta);
  EXPECT_DOUBLE_EQ(k0.hbm_fixed, in.hbm_fixed);
  // Beyond the keepable tail: an error naming the layer that cannot keep.
  Instance partial = in;
  partial.beta_kept[3] = 0;
  EXPECT_EQ(keepable_tail(partial), 2);
  EXPECT_NO_THROW(with_kept(partial, 2));
  expect_error_naming([&] { with_kept(partial, 3); }, "layer 3");
  partial.keep_bytes[5] = 0;
  EXPECT_EQ(keepable_tail(partial), 0);
  expect_error_naming([&] { with_kept(partial, 1); }, "layer 5");
  EXPECT_THROW(with_kept(in, 7), Error);
  EXPECT_THROW(with_kept(in, -1), Error);
  EXPECT_THROW(with_kept(k2, 1), Error);  // already kept
  // A chunk that does not divide the batch: the executor keeps ceil(7 / 4) = 2 chunks of 4 samples.
  o.chunk = 4;
  EXPECT_NEAR(make_instance(c, 7, 64, p, o).keep_bytes[0], 8.0 * MiB, 1e-3);
  o.chunk = 2;
  // Estimated times: nothing can keep.
  p.layer_timings.clear();
  const Instance est = make_instance(c, 8, 64, p, o);
  EXPECT_EQ(keepable_tail(est), 0);
  expect_error_naming([&] { with_kept(est, 1); }, "layer 5");
}

// ---------------------------------------------------------------- (d), (e) the planner

// tiny-qwen3 with 8 layers at 4 x 64 on h200, measured layer timings large enough that compute dominates (transfers
// and the optimizer of the tiny model hide under it): fwd 10 ms, bwd 20 ms, kept backward 12 ms, keep_bytes each.
PlanRequest kept_request(int64_t keep_bytes) {
  PlanRequest r;
  r.model = preset_config("tiny-qwen3");
  r.model.layers = 8;
  r.batch = 4;
  r.seq = 64;
  r.profile = h200();
  r.profile.layer_timings = {kept_timing(r.model, 4, 64, 0.010, 0.020, 0.012, keep_bytes)};
  r.milp.time_limit_s = 10;
  return r;
}

TEST(PlanKept, PlannerKeepsTheLastLayersWhenItIsAClearWin) {
  PlanRequest r = kept_request(64 * MiB);  // 8 x 64 MiB: plenty of room on the h200's GPU
  const PlanOutcome on = make_plan(r);
  r.keep_internals = false;
  const PlanOutcome off = make_plan(r);
  ASSERT_TRUE(on.feasible) << on.why;
  ASSERT_TRUE(off.feasible) << off.why;
  EXPECT_EQ(off.plan.kept_layers, 0);
  EXPECT_EQ(off.inst.kept, 0);
  // Every layer keeps (each saves beta - beta_kept = 30 - 12 = 18 ms), the instance and every candidate with it.
  EXPECT_EQ(on.plan.kept_layers, 8);
  EXPECT_EQ(on.inst.kept, 8);
  for (auto& cd : on.candidates) EXPECT_EQ(cd.plan.kept_layers, 8) << cd.name;
  EXPECT_DOUBLE_EQ(on.inst.hbm_fixed, off.inst.hbm_fixed + 8.0 * 64 * MiB);
  const double saving = 8 * (0.030 - 0.012);
  EXPECT_NEAR(off.sim.pred.step_s - on.sim.pred.step_s, saving, 0.01 * saving)
      << "on " << on.sim.pred.step_s << " off " << off.sim.pred.step_s;
  EXPECT_DOUBLE_EQ(on.plan.predicted.step_s, on.sim.pred.step_s);
  // The predicted peak counts the kept bytes (hbm_fixed) in every slot.
  EXPECT_GE(double(on.sim.pred.peak_hbm), on.inst.hbm_fixed);
  EXPECT_GE(double(on.sim.pred.peak_hbm) - double(off.sim.pred.peak_hbm), 8.0 * 64 * MiB - 9 * on.inst.A)
      << describe_tiers(on.plan) << " / " << describe_tiers(off.plan);
  // The simulator on the kept instance agrees with the plan's prediction; the report says what is kept.
  EXPECT_DOUBLE_EQ(simulate(on.inst, on.plan).pred.step_s, on.sim.pred.step_s);
  const std::string rep = plan_report(r, on);
  EXPECT_NE(rep.find("kept internals: last 8 layers (512.0 MiB)"), std::string::npos) << rep;
  EXPECT_NE(rep.find("kept internals (last 8 layers)"), std::string::npos) << rep;
  EXPECT_EQ(plan_report(r, off).find("kept internals"), std::string::npos);
}

TEST(PlanKept, PlannerKeepsFewerWhenTheGpuHoldsFewer) {
  // Room for about 3 kept layers besides what the plan needs without keeping: keeps the last 3.
  PlanRequest r = kept_request(64 * MiB);
  r.keep_internals = false;
  const PlanOutcome off = make_plan(r);
  ASSERT_TRUE(off.feasible) << off.why;
  r.keep_internals = true;
  r.profile.hbm_reserve = 0;
  r.profile.hbm_bytes = off.sim.pred.peak_hbm + 3 * 64 * MiB + 32 * MiB;
  const PlanOutcome on = make_plan(r);
  ASSERT_TRUE(on.feasible) << on.why;
  EXPECT_EQ(on.plan.kept_layers, 3);
  EXPECT_LE(double(on.sim.pred.peak_hbm), on.inst.hbm_cap + 0.5);
  EXPECT_NEAR(off.sim.pred.step_s - on.sim.pred.step_s, 3 * 0.018, 0.01 * 3 * 0.018);
}

TEST(PlanKept, PlannerKeepsNothingWhenNoKeptLayerFits) {
  // The cap holds the plan without keeping, but not one more kept layer (keep_bytes far above every boundary).
  PlanRequest r = kept_request(512 * MiB);
  r.keep_internals = false;
  const PlanOutcome off = make_plan(r);
  ASSERT_TRUE(off.feasible) << off.why;
  r.keep_internals = true;
  r.profile.hbm_reserve = 0;
  r.profile.hbm_bytes = off.sim.pred.peak_hbm + 256 * MiB;
  const PlanOutcome on = make_plan(r);
  ASSERT_TRUE(on.feasible) << on.why;
  EXPECT_EQ(on.plan.kept_layers, 0);
  EXPECT_EQ(on.inst.kept, 0);
  EXPECT_NEAR(on.sim.pred.step_s, off.sim.pred.step_s, 1e-9);
  // A profile without the kept figures keeps nothing either; nor does --no-keep-internals with room.
  PlanRequest q = kept_request(0);
  EXPECT_EQ(make_plan(q).plan.kept_layers, 0);
}

TEST(PlanKept, NotAWinKeepsNothing) {
  // The kept backward is no faster than the re-run: nothing to gain, nothing kept (ties: fewer kept layers).
  PlanRequest r = kept_request(64 * MiB);
  r.profile.layer_timings[0].bwd_kept_s = 0.030;
  const PlanOutcome o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  EXPECT_EQ(o.plan.kept_layers, 0);
}

// ---------------------------------------------------------------- (f) plan JSON

Plan sample_plan(int32_t kept) {
  std::mt19937 rng(3);
  Instance in = test::random_instance(rng, 6, false);
  Plan p = test::plan_for(in, {Tier::Gpu, Tier::Cpu, Tier::None, Tier::Nvme, Tier::None, Tier::Gpu, Tier::Gpu});
  p.kept_layers = kept;
  return p;
}

TEST(PlanKept, PlanJsonKeptLayers) {
  const Plan p = sample_plan(2);
  json j = plan_to_json(p);
  EXPECT_EQ(j["kept_layers"].get<int>(), 2);
  const Plan q = plan_from_json(j);
  EXPECT_EQ(q.kept_layers, 2);
  EXPECT_EQ(plan_to_json(q).dump(), j.dump());
  // Written always (0 too); absent reads as 0 (older plans).
  EXPECT_EQ(plan_to_json(sample_plan(0))["kept_layers"].get<int>(), 0);
  json old = j;
  old.erase("kept_layers");
  EXPECT_EQ(plan_from_json(old).kept_layers, 0);
  // All layers may keep; more than the layers, a negative count or a non-integer are errors naming the field.
  json all = j;
  all["kept_layers"] = 6;
  EXPECT_EQ(plan_from_json(all).kept_layers, 6);
  for (json v : {json(7), json(-1), json(1.5), json(int64_t(1) << 33)}) {
    json bad = j;
    bad["kept_layers"] = v;
    expect_error_naming([&] { plan_from_json(bad, "p.json"); }, "kept_layers");
  }
  Plan over = p;
  over.kept_layers = 7;
  try {
    validate_plan(over);
    ADD_FAILURE() << "kept_layers 7 of 6 layers accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("kept_layers"), std::string::npos) << m;
    EXPECT_NE(m.find("layers=6"), std::string::npos) << m;
    EXPECT_NE(m.find("got 7"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace lt
