#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "plan/dp.h"
#include "plan/simulator.h"
#include "plan_test_util.h"

namespace lt {
namespace {

// Brute force over every path x tier assignment with tied windows; the DP must find the optimum of
// that space, and its value must equal the simulator's step time without optimizer waits.
TEST(PlanDp, OptimalInTiedSpaceVsBruteForce) {
  std::mt19937 rng(7);
  int feasible = 0;
  for (int rep = 0; rep < 56; ++rep) {
    const int L = 2 + rep % 7;  // 2..8
    Instance in = test::random_instance(rng, L, false);
    double best = INFINITY;
    test::for_all_tiers(L, [&](const std::vector<Tier>& t) {
      if (!in.allow_nvme)
        for (auto x : t)
          if (x == Tier::Nvme) return;
      Plan p;
      try {
        p = test::plan_for(in, t);
      } catch (const Error&) {
        return;  // nvme boundary without a write window
      }
      auto r = simulate(in, p);
      if (r.fits && r.step_no_opt_s < best) {
        best = r.step_no_opt_s;
        if (getenv("DBG")) fprintf(stderr, "best %s %g peak %ld cap %g dram %g/%g\n", describe_tiers(p).c_str(), best, (long)r.pred.peak_hbm, in.hbm_cap, r.dram, in.dram_cap);
      }
    });
    auto dp = solve_dp(in);
    ASSERT_EQ(dp.feasible, std::isfinite(best)) << "rep " << rep;
    if (!dp.feasible) continue;
    ++feasible;
    EXPECT_NEAR(dp.value, best, 1e-9 * best) << "rep " << rep << " L " << L;
    auto r = simulate(in, test::plan_for(in, dp.tier));
    EXPECT_TRUE(r.fits) << r.violation;
    EXPECT_NEAR(r.step_no_opt_s, dp.value, 1e-9 * dp.value) << "rep " << rep;
  }
  EXPECT_GE(feasible, 20);
}

}  // namespace
}  // namespace lt
