#include <gtest/gtest.h>

#include <cmath>

#include "plan/dp.h"
#include "plan/simulator.h"
#include "plan_test_util.h"

namespace lt {
namespace {

// The DP must find the optimum of the tied space (brute force over every path x tier assignment),
// and its value must equal the simulator's step time without optimizer waits. Returns feasibility.
bool expect_dp_optimal(const Instance& in, int rep) {
  const auto bf = test::best_tied_plan(in, true);
  auto dp = solve_dp(in);
  EXPECT_EQ(dp.feasible, std::isfinite(bf.best)) << "rep " << rep;
  if (!dp.feasible || !std::isfinite(bf.best)) return false;
  EXPECT_NEAR(dp.value, bf.best, 1e-9 * bf.best) << "rep " << rep << " L " << in.L;
  auto r = simulate(in, test::plan_for(in, dp.tier));
  EXPECT_TRUE(r.fits) << r.violation;
  EXPECT_NEAR(r.step_no_opt_s, dp.value, 1e-9 * dp.value) << "rep " << rep;
  return true;
}

TEST(PlanDp, OptimalInTiedSpaceVsBruteForce) {
  std::mt19937 rng(7);
  int feasible = 0;
  for (int rep = 0; rep < 56; ++rep) feasible += expect_dp_optimal(test::random_instance(rng, 2 + rep % 7, false), rep);
  EXPECT_GE(feasible, 20);
}

// Unlike layers (attention / DeltaNet weights, times and working sets), in Qwen3.5's 3:1 pattern
// and in random orders: the per-layer memory checks and transfer sizes must match the simulator's.
TEST(PlanDp, OptimalOnHybridLayersVsBruteForce) {
  std::mt19937 rng(17);
  int feasible = 0;
  for (int rep = 0; rep < 56; ++rep) {
    const int L = 2 + rep % 7;  // 2..8
    Instance in = test::random_instance(rng, L, false);
    test::make_hybrid(in, rng, test::test_kinds(rng, L, rep % 3 != 0));
    feasible += expect_dp_optimal(in, rep);
  }
  EXPECT_GE(feasible, 20);
}

// A real hybrid shape (tiny-qwen35's kinds in random orders, costs from the model accounting).
TEST(PlanDp, OptimalOnRealHybridShapesVsBruteForce) {
  std::mt19937 rng(29);
  int feasible = 0;
  for (int rep = 0; rep < 28; ++rep) feasible += expect_dp_optimal(test::tiny_hybrid_instance(rng, 2 + rep % 6), rep);
  EXPECT_GE(feasible, 14);
}

}  // namespace
}  // namespace lt
