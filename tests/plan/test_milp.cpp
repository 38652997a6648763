#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "plan/dp.h"
#include "plan/milp.h"
#include "plan/simulator.h"
#include "plan_test_util.h"

namespace lt {
namespace {

Plan milp_plan(const Instance& in, const MilpSolution& s) {
  Plan p = test::plan_for(in, std::vector<Tier>(size_t(in.L + 1), Tier::Gpu));
  apply_milp_solution(in, s, p);
  return p;
}

struct MilpVsBrute {
  int solved = 0, strictly_better = 0;
};

// The MILP's objective is the simulator's step time for the MILP's own plan (within 1%), and no
// plan of the tied space (brute force, scored by the simulator incl. optimizer waits) beats it.
void expect_milp_optimal(const Instance& in, int rep, MilpVsBrute& n) {
  const auto bf = test::best_tied_plan(in, false);
  if (std::isfinite(bf.best)) {
    auto v = milp_check_plan(in, test::plan_for(in, bf.tier));
    EXPECT_TRUE(v.empty()) << "rep " << rep << ": " << v.size() << " violations, first: " << v.front();
  }
  MilpOptions o;
  o.time_limit_s = 20;
  o.rel_gap = 1e-6;
  auto dp = solve_dp(in);
  Plan warm;
  if (dp.feasible) warm = test::plan_for(in, dp.tier);
  auto s = solve_milp(in, o, dp.feasible ? &warm : nullptr);
  ASSERT_EQ(s.feasible, std::isfinite(bf.best)) << "rep " << rep;
  if (!s.feasible) return;
  ++n.solved;
  EXPECT_TRUE(s.optimal) << "rep " << rep;
  Plan p = milp_plan(in, s);
  auto r = simulate(in, p);
  EXPECT_TRUE(r.fits) << "rep " << rep << ": " << r.violation;
  EXPECT_NEAR(r.pred.step_s, s.objective, 0.01 * s.objective) << "rep " << rep << " " << describe_tiers(p);
  n.strictly_better += s.objective < bf.best * (1 - 1e-4);
  EXPECT_LE(s.objective, bf.best * (1 + 1e-6)) << "rep " << rep << " milp " << describe_tiers(p) << " brute "
                                               << describe_tiers(test::plan_for(in, bf.tier)) << " bound " << s.bound
                                               << " dp " << (dp.feasible ? describe_tiers(warm) : "-");
}

TEST(PlanMilp, ObjectiveMatchesSimulatorAndBeatsBruteForce) {
  std::mt19937 rng(11);
  MilpVsBrute n;
  for (int rep = 0; rep < 49; ++rep) expect_milp_optimal(test::random_instance(rng, 2 + rep % 7, true), rep, n);
  EXPECT_GE(n.solved, 25);
  // Informative: instances where spreading transfers over several windows beat every tied plan.
  std::printf("milp solved %d instances, strictly better than the whole tied space on %d\n", n.solved, n.strictly_better);
}

// The same on unlike layers: Qwen3.5's 3:1 pattern and random layer orders.
TEST(PlanMilp, HybridLayersObjectiveMatchesSimulatorAndBeatsBruteForce) {
  std::mt19937 rng(23);
  MilpVsBrute n;
  for (int rep = 0; rep < 42; ++rep) {
    const int L = 2 + rep % 7;  // 2..8
    Instance in = test::random_instance(rng, L, true);
    test::make_hybrid(in, rng, test::test_kinds(rng, L, rep % 3 != 0));
    expect_milp_optimal(in, rep, n);
  }
  EXPECT_GE(n.solved, 20);
  std::printf("hybrid: milp solved %d instances, strictly better than the whole tied space on %d\n", n.solved,
              n.strictly_better);
}

// A real hybrid shape (tiny-qwen35's kinds in random orders, costs from the model accounting).
TEST(PlanMilp, RealHybridShapesObjectiveMatchesSimulatorAndBeatsBruteForce) {
  std::mt19937 rng(31);
  MilpVsBrute n;
  for (int rep = 0; rep < 28; ++rep) expect_milp_optimal(test::tiny_hybrid_instance(rng, 2 + rep % 6), rep, n);
  EXPECT_GE(n.solved, 14);
}

}  // namespace
}  // namespace lt
