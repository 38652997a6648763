// One rank's plan request under data parallelism (docs/distributed.md, "Planner: collectives and
// per-rank DRAM"): the rank plans with its share of the host (rank_profile) and the host-staged
// collectives on its PCIe lanes (step_collectives), so that the ranks of one host together stay within
// the host's budget. Used by `lazytrain plan --world-size N` and by the trainer under `launch`.
#pragma once
#include <string>

#include "dist/rank_cost.h"
#include "plan/planner.h"

namespace lt::dist {

// Checks the topology (which value, expected vs actual) and turns a request for the whole host
// (r.profile: the host's resources) into one rank's: r.profile = rank_profile, r.world,
// r.ranks_per_host, r.collectives (host-staged, fp32 host gradients). World 1 leaves r unchanged.
void plan_for_rank(PlanRequest& r, const Topology& t);

// "data parallel: world 2, 2 ranks per host: DRAM 20 GiB per rank x 2 = 40 GiB per host (plan peak
// 9 GiB per rank, 18 GiB per host); collectives per rank and step: H2D 1.2 GiB, D2H 0.6 GiB (+12.3 ms)".
std::string rank_memory_line(const PlanRequest& r, const PlanOutcome& o);

}  // namespace lt::dist
