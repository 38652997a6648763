// One rank's plan request (rank_plan.h).
#include "dist/rank_plan.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "model/accounting.h"

namespace lt::dist {

void plan_for_rank(PlanRequest& r, const Topology& t) {
  LT_CHECK(t.world >= 1, "world size must be >= 1, got {}", t.world);
  LT_CHECK(t.ranks_per_host >= 1 && t.ranks_per_host <= t.world,
           "ranks per host must be in [1, world size {}], got {}", t.world, t.ranks_per_host);
  LT_CHECK(t.world % t.ranks_per_host == 0,
           "ranks per host ({}) must divide the world size ({}): every host runs the same number of ranks",
           t.ranks_per_host, t.world);
  LT_CHECK(t.link_bw >= 0, "GPU-GPU link bandwidth must be >= 0 bytes/s, got {}", t.link_bw);
  if (t.world == 1) return;
  const int64_t params = parameter_count(r.model);
  r.collectives = step_collectives(params, t, r.profile, CollectivePath::HostStaged, 4).lanes;
  r.profile = rank_profile(r.profile, t);
  r.world = t.world;
  r.ranks_per_host = t.ranks_per_host;
}

std::string rank_memory_line(const PlanRequest& r, const PlanOutcome& o) {
  const double per_rank = double(r.profile.dram_bytes), k = double(r.ranks_per_host);
  const double peak = o.feasible ? double(o.sim.pred.peak_dram) : o.inst.dram_fixed;
  const double coll_s = o.inst.L > 0 ? o.inst.step_prologue() + o.inst.step_epilogue() : 0.0;
  return fmt::format(
      "data parallel: world {}, {} ranks per host: DRAM {} per rank x {} = {} per host ({} {} per rank, {} per "
      "host); collectives per rank and step: H2D {}, D2H {} (+{:.1f} ms)\n",
      r.world, r.ranks_per_host, format_bytes(per_rank), r.ranks_per_host, format_bytes(per_rank * k),
      o.feasible ? "plan peak" : "model state", format_bytes(peak), format_bytes(peak * k),
      format_bytes(r.collectives.h2d()), format_bytes(r.collectives.d2h()), coll_s * 1e3);
}

}  // namespace lt::dist
