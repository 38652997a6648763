// One rank's plan request (dist/rank_plan.h): world 1 is today's plan, the ranks of a host together
// stay within its DRAM budget, the collectives are on the lanes, and bad topologies are clear errors.
#include <gtest/gtest.h>

#include "../common/repo_path.h"
#include "core/error.h"
#include "core/units.h"
#include "dist/rank_plan.h"
#include "model/accounting.h"
#include "plan/state_bytes.h"

namespace lt::dist {
namespace {

PlanRequest host_request(const std::string& model, int64_t dram) {
  PlanRequest r;
  r.model = preset_config(model);
  r.batch = 1;
  r.seq = 1024;
  r.profile = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h200.json");
  r.profile.dram_bytes = dram;
  r.planner = "dp";
  r.compare = false;
  return r;
}

TEST(RankPlan, WorldOneIsTodaysPlan) {
  const PlanRequest today = host_request("qwen2.5-0.5b", 64 * GiB);
  PlanRequest r = today;
  plan_for_rank(r, Topology{1, 1, 1, 0});
  EXPECT_EQ(r.world, 1);
  EXPECT_EQ(r.profile.dram_bytes, today.profile.dram_bytes);
  EXPECT_EQ(r.collectives.h2d() + r.collectives.d2h(), 0);
  const auto a = make_plan(today), b = make_plan(r);
  ASSERT_TRUE(a.feasible) << a.why;
  EXPECT_EQ(b.feasible, a.feasible);
  EXPECT_EQ(b.chosen, a.chosen);
  EXPECT_DOUBLE_EQ(b.sim.pred.step_s, a.sim.pred.step_s);
  EXPECT_EQ(b.sim.pred.peak_dram, a.sim.pred.peak_dram);
  EXPECT_EQ(b.sim.pred.peak_hbm, a.sim.pred.peak_hbm);
  EXPECT_EQ(b.plan.tier, a.plan.tier);
  EXPECT_EQ(b.plan.chunk, a.plan.chunk);
  EXPECT_EQ(b.plan.optimizer_8bit, a.plan.optimizer_8bit);
  EXPECT_DOUBLE_EQ(b.state.dram(), a.state.dram());
  EXPECT_EQ(b.placement.moment_shards, 1);
  EXPECT_FALSE(b.placement.fp32_master_array);
}

// A host budget between N ranks' state with 8-bit moments and with fp32 moments: planning each rank
// with the whole host (the old behaviour) picks fp32 moments and N of them overshoot the host; the
// rank's share keeps the N together within it.
TEST(RankPlan, RanksOfAHostStayWithinItsBudget) {
  const auto m = preset_config("qwen2.5-0.5b");
  for (int w : {2, 4}) {
    StatePlacement s;
    s.moment_shards = w;
    s.fp32_master_array = true;
    const double fp32 = model_state_bytes(m, {}, s).dram();
    const double q8 = model_state_bytes(m, choose_8bit(m, "adamw8bit", 0, s), s).dram();
    const int64_t host = int64_t(double(w) * (fp32 + q8) / 2);
    PlanRequest whole = host_request("qwen2.5-0.5b", host);  // every rank with the whole host
    whole.world = w;
    whole.ranks_per_host = w;
    const auto bad = make_plan(whole);
    ASSERT_TRUE(bad.feasible) << bad.why;
    ASSERT_GT(double(bad.sim.pred.peak_dram) * w, double(host)) << "the model must need splitting, world " << w;

    PlanRequest r = host_request("qwen2.5-0.5b", host);
    plan_for_rank(r, Topology{w, w, 1, 0});
    EXPECT_EQ(r.profile.dram_bytes, host / w);
    const auto o = make_plan(r);
    ASSERT_TRUE(o.feasible) << o.why;
    EXPECT_LE(double(o.sim.pred.peak_dram) * w, double(host)) << w;
    EXPECT_FALSE(o.plan.optimizer_8bit.empty()) << w;
    EXPECT_EQ(o.placement.moment_shards, w);
    EXPECT_EQ(o.placement.grads, GradHome::Host);
    const std::string line = rank_memory_line(r, o);
    EXPECT_NE(line.find(fmt::format("world {}, {} ranks per host", w, w)), std::string::npos) << line;
    EXPECT_NE(line.find("per host"), std::string::npos) << line;
  }
}

TEST(RankPlan, CollectivesOnTheLanesLengthenTheStep) {
  const int64_t host = 256 * GiB;
  PlanRequest r = host_request("qwen2.5-0.5b", host);
  plan_for_rank(r, Topology{2, 2, 1, 0});
  const double P = double(parameter_count(r.model));
  EXPECT_DOUBLE_EQ(r.collectives.grad_h2d, 4 * P);
  EXPECT_DOUBLE_EQ(r.collectives.grad_d2h, 2 * P);
  EXPECT_DOUBLE_EQ(r.collectives.weight_h2d, P);
  EXPECT_DOUBLE_EQ(r.collectives.weight_d2h, 2 * P);
  const auto hs = step_collectives(int64_t(P), Topology{2, 2, 1, 0}, r.profile, CollectivePath::HostStaged);
  EXPECT_DOUBLE_EQ(hs.lanes.h2d(), hs.h2d);
  EXPECT_DOUBLE_EQ(hs.lanes.d2h(), hs.d2h);
  const auto o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  PlanRequest none = r;
  none.collectives = {};
  const auto q = make_plan(none);
  ASSERT_TRUE(q.feasible) << q.why;
  EXPECT_GT(o.inst.step_prologue(), 0);
  EXPECT_GT(o.inst.step_epilogue(), 0);
  // Serial on the lanes: the step without optimizer waits grows by both (the CPU optimizer of a 0.5B
  // model at batch 1 may still be the longer lane: the predicted step grows by at most both).
  const double both = o.inst.step_prologue() + o.inst.step_epilogue();
  EXPECT_NEAR(o.sim.step_no_opt_s, q.sim.step_no_opt_s + both, 1e-6 * o.sim.step_no_opt_s);
  EXPECT_GE(o.sim.pred.step_s, q.sim.pred.step_s);
  EXPECT_LE(o.sim.pred.step_s, q.sim.pred.step_s + both + 1e-9);
}

TEST(RankPlan, BadTopologiesAreClearErrors) {
  auto expect_error = [](Topology t, const std::string& needle) {
    PlanRequest r = host_request("tiny-qwen3", 8 * GiB);
    try {
      plan_for_rank(r, t);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({0, 1, 1, 0}, "world size must be >= 1, got 0");
  expect_error({2, 4, 1, 0}, "ranks per host must be in [1, world size 2], got 4");
  expect_error({4, 0, 1, 0}, "got 0");
  expect_error({4, 3, 1, 0}, "ranks per host (3) must divide the world size (4)");
  expect_error({2, 2, 1, -1}, "link bandwidth must be >= 0");
}

}  // namespace
}  // namespace lt::dist
