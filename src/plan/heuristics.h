// Baseline schedules in the same plan space (matched comparisons), and plan construction helpers.
#pragma once
#include <string>
#include <vector>

#include "plan/instance.h"
#include "plan/plan.h"

namespace lt {

// Fill p.blocks and p.traffic from p.tier with the "tied" windows (the DP's restricted space):
//   d2h(i) in F_i; nvme_write(i) in the slot after (F_{i+1}, or H when i = L-1);
//   h2d(s) of block (s,e) in the slot before the block (B_e, or H when e = L);
//   nvme_read(s) one slot earlier still (B_{e+1}, H when e = L-1, F_{L-1} when e = L).
// Throws lt::Error when an nvme boundary cannot be written before it must be read back.
void assign_tied_traffic(const Instance& in, Plan& p);
// First plan window of every slot (instance.h numbering); p.tier must be set.
std::vector<int32_t> slot_first_window(const Instance& in, const Plan& p);
// Is nvme a valid tier for boundary i followed on the path by e under the tied rule?
bool tied_nvme_ok(int L, int i, int e);

// Names: "megatrain:K" (every K-th boundary on the GPU, K >= 1), "all-gpu", "sqrt" (every
// ceil(sqrt(L))-th on the GPU), "cpu-all" (every boundary, 1..L-1 on the CPU).
std::vector<Tier> heuristic_tiers(const std::string& name, int L);
std::vector<std::string> heuristic_names();  // the defaults compared side by side

// The planner names, in one place (config `planner:`, `plan --planner`, the benchmarks):
//   milp | dp | megatrain:K | all-gpu | sqrt | cpu-all   ("megatrain" = megatrain:4, "all-cpu" = cpu-all)
constexpr const char* kPlannerNames = "milp | dp | megatrain:K | all-gpu | sqrt | cpu-all";
// The canonical form of a planner name (aliases resolved, megatrain:K checked); an unknown name is an
// lt::Error listing kPlannerNames.
std::string canonical_planner(const std::string& name);
bool is_heuristic(const std::string& name);

}  // namespace lt
