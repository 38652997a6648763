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

// Some rung's model state fits the caps (a cheap check before planning).
bool any_state_fits(const PlanRequest& x) {
  for (const StateChoice& s : placement_ladder(x))
    if (state_fits(x, s)) return true;
  return false;
}

bool fits(const PlanRequest& q) {
  const PlanRequest x = probe(q);
  try {
    return any_state_fits(x) && make_plan(x).feasible;
  } catch (const Error&) {
    return false;  // a change the rest of the request rules out
  }
}

// The rungs of the ladder's last level (the most frugal ones).
std::vector<StateChoice> last_level(const PlanRequest& r) {
  auto ladder = placement_ladder(r);
  const int level = ladder.back().level;
  std::erase_if(ladder, [&](const StateChoice& s) { return s.level != level; });
  return ladder;
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
  // Host gradients (in bf16 where the rest allows) leave the HBM the held ones take.
  if (r.grads == GradHome::Device && !dp) add("gradients: host", [](PlanRequest& q) { q.grads = GradHome::Host; });
  if (r.grad_dtype == GradDType::F32 && !dp && !device_layers)
    add("gradient_dtype: bf16", [](PlanRequest& q) { q.grad_dtype = GradDType::Bf16; });
  if (r.optimizer == "adamw") add("optimizer: hybrid", [](PlanRequest& q) { q.optimizer = "hybrid"; });
  if (!dp && !device_layers && r.master != MasterMode::Bf16Sr && !(!r.master && r.allow_bf16_master))
    add("master_weights: bf16-sr", [](PlanRequest& q) { q.master = MasterMode::Bf16Sr; });
  // The head's gradient forced whole: by vocabulary slices it frees a [vocab, hidden] fp32 buffer of HBM.
  if (!dp && r.head_grad_slices == false && !r.model.tied)
    add("head_gradient: auto", [](PlanRequest& q) { q.head_grad_slices.reset(); });
  if (!dp && !r.allow_nvme_moments && !r.nvme_all_layers && r.profile.nvme_bytes > 0)
    add("optimizer_nvme: auto", [](PlanRequest& q) { q.allow_nvme_moments = true; });
  if (labels.size() >= 2) v.push_back({fmt::format("{}", fmt::join(labels, ", ")), all});
  return v;
}

// With the NVMe tier allowed for the moments (as asked, or with optimizer_nvme: auto where the modes alone did not
// fit): the least NVMe space (whole GiB) with which the request fits, up to every layer's moments and every boundary.
bool nvme_change(const PlanRequest& r, Change& out) {
  if (r.world > 1) return false;
  PlanRequest base = r;
  std::string label;
  if (!r.allow_nvme_moments && !r.nvme_all_layers) {
    base.allow_nvme_moments = true;
    label = "optimizer_nvme: auto, ";
  }
  StatePlacement all = last_level(base).back().placement;
  all.nvme_layers = r.model.layers;
  const auto q8 = choose_8bit(r.model, r.optimizer, double(r.profile.dram_bytes), all);
  const double A = double(r.batch * r.seq * r.model.hidden * 2);
  int64_t lo = r.profile.nvme_bytes / GiB;  // does not fit (at most this much)
  const int64_t hi0 = int64_t(std::ceil((model_state_bytes(r.model, q8, all).nvme() + double(r.model.layers) * A) / GiB)) + 1;
  if (hi0 <= lo) return false;
  auto at = [&](int64_t gib) {
    PlanRequest q = base;
    q.profile.nvme_bytes = gib * GiB;
    return q;
  };
  int64_t hi = hi0;
  if (!fits(at(hi))) return false;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (fits(at(mid)) ? hi : lo) = mid;
  }
  out = {fmt::format("{}nvme_mem >= {} GiB", label, hi), at(hi)};
  return true;
}

// The least host memory (whole GiB) with which the request fits, if any up to the model state plus
// every boundary in DRAM and the NVMe staging.
bool host_mem_change(const PlanRequest& r, Change& out) {
  double state = 0;
  for (const StateChoice& s : last_level(r)) state = std::max(state, model_state_bytes(r.model, s.q8, s.placement).dram());
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
  if (r.batch <= 1 || !any_state_fits(x)) return false;
  const int64_t b = max_feasible_batch(x, x.planner, r.batch - 1);
  if (b < 1) return false;
  out = {fmt::format("batch <= {}", b), r};
  out.q.batch = b;
  return true;
}

}  // namespace

// The changed request's plan in the DP's space: its predicted step, and what the moments' NVMe I/O adds to it.
void predict(FitAdvice& a) {
  try {
    const PlanOutcome o = make_plan(probe(a.request));
    if (!o.feasible) return;
    a.step_s = o.sim.pred.step_s;
    a.nvme_layers = o.placement.nvme_layers;
    a.nvme_remainders = remainders_on_nvme(o.placement);
    a.nvme_cost_s = o.nvme_moments_cost_s;
  } catch (const Error&) {
  }
}

std::string FitAdvice::text() const {
  if (change.empty()) return fmt::format("; none of these fits: {}", fmt::join(tried, "; "));
  std::string t = "; it fits with " + change;
  if (step_s <= 0) return t;
  t += fmt::format(" (predicted step {:.2f} s", step_s);
  if (nvme_layers > 0)
    t += fmt::format(", of which the moments {}of {} layers on NVMe add {:.2f} s",
                     nvme_remainders ? "and master remainders " : "", nvme_layers, nvme_cost_s);
  return t + ")";
}

FitAdvice fit_advice(const PlanRequest& r) {
  FitAdvice a;
  auto found = [&](const Change& c) {
    a.change = c.label;
    a.request = c.q;
    a.request.explain = r.explain;
    predict(a);
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
  if (r.allow_nvme_moments || r.nvme_all_layers || (r.world == 1 && r.profile.nvme_bytes > 0)) {
    a.tried.push_back("more NVMe space");
    if (nvme_change(r, c)) return found(c);
  }
  a.tried.push_back("more host memory");
  if (host_mem_change(r, c)) return found(c);
  a.tried.push_back("a smaller batch");
  if (batch_change(r, c)) return found(c);
  return a;
}

}  // namespace lt
