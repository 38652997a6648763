// The MILP scheduler (docs/planner.md, "MILP"): path x(s,e), tiers g/c/n, cumulative fractions of
// every checkpoint transfer per slot, slot times with PCIe/NVMe bandwidth, optimizer waits, HBM per
// slot, DRAM and NVMe capacity; minimises the step time. Solved with COIN-OR CBC (CbcMain, time limit,
// relative gap), warm-started from a plan (the DP's).
#pragma once
#include <string>
#include <vector>

#include "plan/instance.h"
#include "plan/plan.h"

namespace lt {

struct MilpOptions {
  double time_limit_s = 30;
  double rel_gap = 0.005;  // stop when (objective - bound) / objective <= this
  bool verbose = false;    // CBC log on stderr
};

struct MilpSolution {
  bool feasible = false;
  bool optimal = false;  // proven within rel_gap
  double objective = 0;  // predicted step time, seconds
  double bound = 0;      // best lower bound
  double gap = 0;        // (objective - bound) / objective
  double solve_s = 0;
  int columns = 0, rows = 0, integers = 0, edges = 0;
  std::vector<Tier> tier;
  // Per boundary: cumulative fraction by slot (instance.h numbering), empty when not offloaded.
  std::vector<std::vector<double>> d2h, nvme_write, nvme_read, h2d;
};

// warm: a plan whose tiers seed CBC (may be null).
MilpSolution solve_milp(const Instance& in, const MilpOptions& o, const Plan* warm);
// Constraints of the MILP that a plan violates when written as a point of the model (empty: the plan
// is in the MILP's space with the simulator's times). Used by tests and `plan --explain`.
std::vector<std::string> milp_check_plan(const Instance& in, const Plan& p);
// Sets p.tier/blocks/traffic from the solution (shares at each slot's first plan window).
void apply_milp_solution(const Instance& in, const MilpSolution& s, Plan& p);

}  // namespace lt
