// The smallest change that makes a request fit (fit_advice.h).
#include "plan/fit_advice.h"

#include <cmath>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/units.h"
#include "plan/placement.h"

namespace lt {

namespace {

struct Change {
  std::string label;
  PlanRequest q;
};

// The request as the re-checks run it: no advice of its own, no side-by-side table, the DP's space
// for the MILP (the MILP's plan is never worse than the DP's).
PlanRequest probe(PlanRequest q) {
  q.explain = false;
  q.compare = false;
  if (q.planner == "milp") q.planner = "dp";
  return q;
}

bool fits(const PlanRequest& q) {
  const PlanRequest x = probe(q);
  try {
    return state_fits(x, placement_ladder(x).back()) && make_plan(x).feasible;
  } catch (const Error&) {
    return false;  // a change the rest of the request rules out
  }
}

// Layers forced onto the GPU for their updates take HBM from the checkpoints: the most of them that fit.
bool device_layers_change(const PlanRequest& r, Change& out) {
  const int64_t forced = r.device_update_layers.value_or(0);
  auto at = [&](int64_t k) {
    PlanRequest q = r;
    q.device_update_layers = k;
    return q;
  };
  if (!fits(at(0))) return false;
  int64_t lo = 0, hi = forced;  // fits with lo layers; does not with hi
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (fits(at(mid)) ? lo : hi) = mid;
  }
  out = {lo > 0 ? fmt::format("device_update_layers <= {}", lo) : "device_update_layers: 0", at(lo)};
  return true;
}

// Modes the planner was not allowed to choose, one at a time, then all of them together.
std::vector<Change> mode_changes(const PlanRequest& r) {
  std::vector<Change> v;
  PlanRequest all = r;
  std::vector<std::string> labels;
  auto add = [&](const std::string& label, auto apply) {
    PlanRequest q = r;
    apply(q);
    apply(all);
    v.push_back({label, q});
    labels.push_back(label);
  };
  // Data parallelism runs host gradients and fp32 masters only (placement.h), and so do layers updated on the GPU.
  const bool dp = r.world > 1;
  const bool device_layers = r.device_update_layers.value_or(0) > 0;
  if (r.grads == GradHome::Host && !dp && !device_layers)
    add("gradients: device", [](PlanRequest& q) { q.grads = GradHome::Device; });
  if (r.optimizer == "adamw") add("optimizer: hybrid", [](PlanRequest& q) { q.optimizer = "hybrid"; });
  if (!dp && !device_layers && r.master != MasterMode::Bf16Sr && !(!r.master && r.allow_bf16_master))
    add("master_weights: bf16-sr", [](PlanRequest& q) { q.master = MasterMode::Bf16Sr; });
  if (labels.size() >= 2) v.push_back({fmt::format("{}", fmt::join(labels, ", ")), all});
  return v;
}

// The least host memory (whole GiB) with which the request fits, if any up to the model state plus
// every boundary in DRAM and the NVMe staging.
bool host_mem_change(const PlanRequest& r, Change& out) {
  const auto last = placement_ladder(r).back();
  const double state = model_state_bytes(r.model, last.q8, last.placement).dram();
  const double A = double(r.batch * r.seq * r.model.hidden * 2);
  int64_t lo = r.profile.dram_bytes / GiB;  // does not fit (at most this much)
  int64_t hi = int64_t(std::ceil((state + double(r.model.layers + 5) * A) / double(GiB)));
  if (hi <= lo) return false;
  auto at = [&](int64_t gib) {
    PlanRequest q = r;
    q.profile.dram_bytes = gib * GiB;
    return q;
  };
  if (!fits(at(hi))) return false;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (fits(at(mid)) ? hi : lo) = mid;
  }
  // Data parallelism: the profile is one rank's share of the host; host_mem is the host's budget.
  out = {r.ranks_per_host > 1 ? fmt::format("host_mem >= {} GiB ({} GiB per rank x {} ranks per host)",
                                            hi * r.ranks_per_host, hi, r.ranks_per_host)
                              : fmt::format("host_mem >= {} GiB", hi),
         at(hi)};
  return true;
}

bool batch_change(const PlanRequest& r, Change& out) {
  const PlanRequest x = probe(r);
  if (r.batch <= 1 || !state_fits(x, placement_ladder(x).back())) return false;
  const int64_t b = max_feasible_batch(x, x.planner, r.batch - 1);
  if (b < 1) return false;
  out = {fmt::format("batch <= {}", b), r};
  out.q.batch = b;
  return true;
}

}  // namespace

std::string FitAdvice::text() const {
  if (!change.empty()) return "; it fits with " + change;
  return fmt::format("; none of these fits: {}", fmt::join(tried, "; "));
}

FitAdvice fit_advice(const PlanRequest& r) {
  FitAdvice a;
  auto found = [&](const Change& c) {
    a.change = c.label;
    a.request = c.q;
    a.request.explain = r.explain;
    return a;
  };
  Change c;
  if (r.device_update_layers.value_or(0) > 0) {
    a.tried.push_back("fewer layers updated on the GPU");
    if (device_layers_change(r, c)) return found(c);
  }
  for (auto& m : mode_changes(r)) {
    a.tried.push_back(m.label);
    if (fits(m.q)) return found(m);
  }
  a.tried.push_back("more host memory");
  if (host_mem_change(r, c)) return found(c);
  a.tried.push_back("a smaller batch");
  if (batch_change(r, c)) return found(c);
  return a;
}

}  // namespace lt
