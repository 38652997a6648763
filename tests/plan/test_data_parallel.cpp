// Data parallelism in the planner: per-rank model-state bytes (moments sharded, fp32
// master arrays), the placement ladder restricted to what the data-parallel trainer runs, and the
// collectives' bytes once per step in the instance, the simulator and the DP.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "plan/dp.h"
#include "plan/fit_advice.h"
#include "plan/placement.h"
#include "plan/planner.h"
#include "plan/simulator.h"
#include "plan/state_bytes.h"
#include "plan_test_util.h"

namespace lt {
namespace {

// tiny-qwen3 (tests/plan/test_state.cpp): 131520 parameters, the largest layer 49344.
constexpr double kN = 131520, kLayer = 49344;

ModelConfig tiny() { return preset_config("tiny-qwen3"); }

StatePlacement rank_placement(int world) {
  StatePlacement s;
  s.moment_shards = world;
  s.fp32_master_array = world > 1;
  return s;
}

TEST(PlanDataParallel, PerRankStateBytesByHand) {
  const auto c = tiny();
  for (int w : {1, 2, 4}) {
    const auto b = model_state_bytes(c, {}, rank_placement(w));
    // Masters and gradients are whole on every rank; the moments are the rank's shard.
    EXPECT_DOUBLE_EQ(b.master, (w > 1 ? 6 : 4) * kN) << w;  // fp32 array + bf16 copy vs split 4 B
    EXPECT_DOUBLE_EQ(b.grads_host, 4 * kN) << w;
    EXPECT_DOUBLE_EQ(b.moments, 8 * kN / w) << w;
    EXPECT_DOUBLE_EQ(b.staging, 2 * 2 * kLayer) << w;
    EXPECT_DOUBLE_EQ(b.dram(), (w > 1 ? 6 : 4) * kN + 4 * kN + 8 * kN / w + 4 * kLayer) << w;
  }
  // 8-bit moments are sharded too.
  const auto q8 = choose_8bit(c, "adamw8bit", 0);
  const double all8 = model_state_bytes(c, q8, {}).moments;
  EXPECT_DOUBLE_EQ(model_state_bytes(c, q8, rank_placement(4)).moments, all8 / 4);
  StatePlacement bad;
  bad.moment_shards = 0;
  EXPECT_THROW(model_state_bytes(c, {}, bad), Error);
  // The memory table names the shard and the fp32 array.
  bool shard = false, array = false;
  for (const auto& p : model_state_bytes(c, {}, rank_placement(2)).parts()) {
    shard |= p.name.find("shard 1/2") != std::string::npos;
    array |= p.name.find("fp32 array") != std::string::npos;
  }
  EXPECT_TRUE(shard);
  EXPECT_TRUE(array);
}

PlanRequest rank_request(double dram, int world) {
  PlanRequest r = test::tiny_state_request(dram);
  r.planner = "dp";
  r.compare = false;
  r.world = world;
  r.ranks_per_host = world;
  return r;
}

TEST(PlanDataParallel, LadderOffersOnlyWhatTheTrainerRuns) {
  const double fp32 = 6 * kN + 4 * kN + 4 * kN + 4 * kLayer;  // world 2, fp32 moments
  for (double dram : {fp32 + 3e4, fp32 - 1e5, 1e9}) {
    const auto r = rank_request(dram, 2);
    for (const auto& s : placement_ladder(r)) {
      EXPECT_EQ(s.placement.master, MasterMode::Fp32);
      EXPECT_EQ(s.placement.grads, GradHome::Host);
      EXPECT_EQ(s.placement.nvme_layers, 0);
      EXPECT_EQ(s.placement.moment_shards, 2);
      EXPECT_TRUE(s.placement.fp32_master_array);
    }
  }
  // Room for fp32 moments: no 8-bit; a little less: hybrid 8-bit matrices, never device gradients.
  auto o = make_plan(rank_request(fp32 + 3e4, 2));
  ASSERT_TRUE(o.feasible) << o.why;
  EXPECT_TRUE(o.plan.optimizer_8bit.empty());
  EXPECT_DOUBLE_EQ(o.state.dram(), fp32);
  o = make_plan(rank_request(fp32 - 1e5, 2));
  ASSERT_TRUE(o.feasible) << o.why;
  EXPECT_FALSE(o.plan.optimizer_8bit.empty());
  EXPECT_EQ(o.placement.grads, GradHome::Host);
  EXPECT_LE(o.state.dram(), fp32 - 1e5);
  // The same DRAM on one process would have fit fp32 moments (its master is 4 B, its moments whole: no).
  // Too little: the advice does not offer what the trainer cannot run.
  o = make_plan(rank_request(6 * kN, 2));
  EXPECT_FALSE(o.feasible);
  EXPECT_EQ(o.why.find("gradients: device"), std::string::npos) << o.why;
  EXPECT_EQ(o.why.find("bf16-sr"), std::string::npos) << o.why;
  EXPECT_NE(o.why.find("ranks per host"), std::string::npos) << o.why;  // host_mem >= X GiB (Y per rank x 2)
}

TEST(PlanDataParallel, ForcedModesTheTrainerCannotRunAreErrors) {
  auto expect_error = [](PlanRequest r, const std::string& needle) {
    try {
      make_plan(r);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto r = rank_request(1e9, 2);
  r.master = MasterMode::Bf16Sr;
  expect_error(r, "master_weights 'bf16-sr' with world size 2");
  r = rank_request(1e9, 2);
  r.grads = GradHome::Device;
  expect_error(r, "gradients 'device' with world size 2");
  r = rank_request(1e9, 2);
  r.allow_nvme_moments = true;
  expect_error(r, "optimizer_nvme 'auto' with world size 2");
  r = rank_request(1e9, 2);
  r.ranks_per_host = 3;
  expect_error(r, "ranks per host in [1, world]");
  r = rank_request(1e9, 2);
  r.world = 0;
  expect_error(r, "world size must be >= 1");
  // World 1: today's modes are still offered.
  r = rank_request(1e9, 1);
  r.grads = GradHome::Device;
  EXPECT_TRUE(make_plan(r).feasible);
}

TEST(PlanDataParallel, CollectivesAreOnceAPerStepPrologueAndEpilogue) {
  for (int micro : {1, 3}) {
    auto r = rank_request(1e9, 1);
    r.micro_batches = micro;
    const auto base = make_plan(r);
    ASSERT_TRUE(base.feasible) << base.why;
    EXPECT_EQ(base.inst.step_prologue(), 0);
    EXPECT_EQ(base.inst.step_epilogue(), 0);
    // About 10 ms each way on this profile's PCIe.
    r.collectives = {0.01 * r.profile.h2d_bw, 0.004 * r.profile.d2h_bw, 0.002 * r.profile.h2d_bw,
                     0.01 * r.profile.d2h_bw};
    const auto o = make_plan(r);
    ASSERT_TRUE(o.feasible) << o.why;
    EXPECT_DOUBLE_EQ(o.inst.coll.grad_h2d, r.collectives.grad_h2d);
    EXPECT_DOUBLE_EQ(o.inst.coll.weight_d2h, r.collectives.weight_d2h);
    const double pre = o.inst.pcie(r.collectives.weight_h2d, r.collectives.weight_d2h);
    const double post = o.inst.pcie(r.collectives.grad_h2d, r.collectives.grad_d2h);
    EXPECT_DOUBLE_EQ(o.inst.step_prologue(), pre);
    EXPECT_DOUBLE_EQ(o.inst.step_epilogue(), post);
    EXPECT_GE(pre, 0.0099);
    EXPECT_GE(post, 0.0099);
    // Serial on the lanes, once per optimizer step (not per micro-batch): the step without optimizer
    // waits grows by both exactly; the predicted step by both less the optimizer wait they absorb.
    EXPECT_NEAR(o.sim.step_no_opt_s, base.sim.step_no_opt_s + pre + post, 1e-12) << "micro " << micro;
    EXPECT_LE(o.sim.pred.step_s, base.sim.pred.step_s + pre + post + 1e-12) << "micro " << micro;
    EXPECT_GE(o.sim.pred.step_s, base.sim.pred.step_s + pre + post - base.sim.pred.exposed_optimizer_s - 1e-12)
        << "micro " << micro;
    EXPECT_GT(o.sim.pred.step_s, base.sim.pred.step_s + 0.9 * (pre + post)) << "micro " << micro;
    EXPECT_GT(o.sim.pred.exposed_h2d_s + o.sim.pred.exposed_d2h_s,
              base.sim.pred.exposed_h2d_s + base.sim.pred.exposed_d2h_s + pre + post - 1e-9);
  }
}

// The DP's value is still the simulator's step without optimizer waits, and the MILP's plan is scored
// the same way, with the collectives in.
TEST(PlanDataParallel, DpAndSimulatorAgreeWithCollectives) {
  std::mt19937 rng(3);
  int feasible = 0;
  for (int rep = 0; rep < 20; ++rep) {
    Instance in = test::random_instance(rng, 2 + rep % 5, false);
    in.coll = {3.0 * rep, 1.0, 2.0, 5.0 * rep};
    const auto dp = solve_dp(in);
    if (!dp.feasible) continue;
    ++feasible;
    const auto sim = simulate(in, test::plan_for(in, dp.tier), true);
    EXPECT_NEAR(sim.step_no_opt_s, dp.value, 1e-9 * dp.value) << rep;
    const bool gather = std::any_of(sim.ops.begin(), sim.ops.end(), [](const auto& op) { return op.label == "weight all-gather"; });
    EXPECT_TRUE(gather) << rep;
  }
  EXPECT_GE(feasible, 5);
  auto r = rank_request(1e9, 2);
  r.planner = "milp";
  r.collectives = {0.01 * r.profile.h2d_bw, 0, 0, 0.01 * r.profile.d2h_bw};
  const auto o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  ASSERT_TRUE(o.milp && o.milp->feasible);
  EXPECT_GE(o.sim.pred.step_s, 0.02 - 1e-9);
}

TEST(PlanDataParallel, PlanJsonKeepsTheShardedPlacement) {
  const auto o = make_plan(rank_request(1e9, 4));
  ASSERT_TRUE(o.feasible) << o.why;
  const auto j = plan_to_json(o.plan);
  EXPECT_EQ(j.at("moment_shards").get<int>(), 4);
  EXPECT_TRUE(j.at("fp32_master_array").get<bool>());
  const Plan back = plan_from_json(j);
  EXPECT_EQ(back.placement.moment_shards, 4);
  EXPECT_TRUE(back.placement.fp32_master_array);
  // World 1 writes neither field (plans of one process are unchanged).
  const auto one = plan_to_json(make_plan(rank_request(1e9, 1)).plan);
  EXPECT_FALSE(one.contains("moment_shards"));
  EXPECT_FALSE(one.contains("fp32_master_array"));
}

}  // namespace
}  // namespace lt
