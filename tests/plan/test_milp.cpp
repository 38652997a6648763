#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/error.h"
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

// The MILP's objective is the simulator's step time for the MILP's own plan (within 1%), and
// no plan of the tied space (brute force, scored by the simulator incl. optimizer waits) beats it.
TEST(PlanMilp, ObjectiveMatchesSimulatorAndBeatsBruteForce) {
  std::mt19937 rng(11);
  int solved = 0, strictly_better = 0;
  for (int rep = 0; rep < 49; ++rep) {
    const int L = 2 + rep % 7;  // 2..8
    Instance in = test::random_instance(rng, L, true);
    double best = INFINITY;
    std::vector<Tier> best_t;
    test::for_all_tiers(L, [&](const std::vector<Tier>& t) {
      if (!in.allow_nvme)
        for (auto x : t)
          if (x == Tier::Nvme) return;
      Plan p;
      try {
        p = test::plan_for(in, t);
      } catch (const Error&) {
        return;
      }
      auto r = simulate(in, p);
      if (r.fits && r.pred.step_s < best) {
        best = r.pred.step_s;
        best_t = t;
      }
    });
    if (std::isfinite(best)) {
      auto v = milp_check_plan(in, test::plan_for(in, best_t));
      EXPECT_TRUE(v.empty()) << "rep " << rep << ": " << v.size() << " violations, first: " << v.front();
    }
    MilpOptions o;
    o.time_limit_s = 20;
    o.rel_gap = 1e-6;
    auto dp = solve_dp(in);
    Plan warm;
    if (dp.feasible) warm = test::plan_for(in, dp.tier);
    auto s = solve_milp(in, o, dp.feasible ? &warm : nullptr);
    ASSERT_EQ(s.feasible, std::isfinite(best)) << "rep " << rep;
    if (!s.feasible) continue;
    ++solved;
    EXPECT_TRUE(s.optimal) << "rep " << rep;
    Plan p = milp_plan(in, s);
    auto r = simulate(in, p);
    EXPECT_TRUE(r.fits) << "rep " << rep << ": " << r.violation;
    EXPECT_NEAR(r.pred.step_s, s.objective, 0.01 * s.objective) << "rep " << rep << " " << describe_tiers(p);
    strictly_better += s.objective < best * (1 - 1e-4);
    EXPECT_LE(s.objective, best * (1 + 1e-6)) << "rep " << rep << " milp " << describe_tiers(p) << " brute " << describe_tiers(test::plan_for(in, best_t)) << " bound " << s.bound << " dp " << (dp.feasible ? describe_tiers(warm) : "-");
  }
  EXPECT_GE(solved, 25);
  // Informative: instances where spreading transfers over several windows beat every tied plan.
  std::printf("milp solved %d instances, strictly better than the whole tied space on %d\n", solved, strictly_better);
}

}  // namespace
}  // namespace lt
