// Exact dynamic program over boundaries for the restricted plan space where every checkpoint
// transfer is tied to a fixed slot (heuristics.h, assign_tied_traffic). Objective: the step time
// without optimizer waits (sum of slot times + prologue + epilogue), which the simulator reports as
// step_no_opt_s; the DP's value equals it for the DP's plan. Capacities: GPU-tier count in the state
// (HBM depends on it), CPU and NVMe counts in the state only when their budgets bind.
#pragma once
#include <optional>
#include <vector>

#include "plan/instance.h"
#include "plan/plan.h"

namespace lt {

struct DpResult {
  bool feasible = false;
  std::vector<Tier> tier;  // size L+1
  double value = 0;        // step time without optimizer waits, seconds
  double solve_s = 0;
  long long states = 0;
};

DpResult solve_dp(const Instance& in);

}  // namespace lt
