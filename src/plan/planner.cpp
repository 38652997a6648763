#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "model/accounting.h"
#include "model/param_layout.h"
#include "plan/fit_advice.h"
#include "plan/heuristics.h"
#include "plan/placement.h"

namespace lt {

std::vector<std::string> choose_8bit(const ModelConfig& c, const std::string& mode, double dram_budget,
                                     StatePlacement s) {
  LT_CHECK(mode == "adamw" || mode == "adamw8bit" || mode == "hybrid",
           "unknown optimizer '{}': expected adamw, adamw8bit or hybrid", mode);
  std::vector<std::string> out;
  if (mode == "adamw") return out;
  struct T {
    std::string name;
    int64_t numel;
  };
  // Every 2-D matrix (the optimizer's q8 rule, optim/layout_spec.h), in unit order; the input
  // embedding only with s.embedding_8bit.
  std::vector<T> elig;
  for (auto& u : model_layout(c).units)
    for (auto& p : u.params)
      if (p.is_matrix && (!p.is_embedding || s.embedding_8bit)) elig.push_back({p.name, p.numel});
  if (mode == "adamw8bit") {
    for (auto& t : elig) out.push_back(t.name);
    return out;
  }
  // Hybrid: largest first (ties: the earlier unit first), until the model state fits.
  std::stable_sort(elig.begin(), elig.end(), [](const T& a, const T& b) { return a.numel > b.numel; });
  double need = model_state_bytes(c, {}, s).dram();
  for (auto& t : elig) {
    if (need <= dram_budget) break;
    out.push_back(t.name);
    need -= (moment_bytes(t.numel, false) - moment_bytes(t.numel, true)) / double(s.moment_shards);
  }
  return out;
}

namespace {

Plan plan_meta(const PlanRequest& r, int64_t chunk, const StateChoice& st, int kept = 0) {
  Plan p;
  p.model = r.model.name;
  p.layers = r.model.layers;
  p.hidden = r.model.hidden;
  p.vocab = r.model.vocab;
  p.batch = r.batch;
  p.seq = r.seq;
  p.micro_batches = r.micro_batches;
  p.chunk = chunk;
  p.ring = r.ring;
  p.optimizer_8bit = st.q8;
  p.placement = st.placement;
  p.embedding_resident = embedding_resident_for(r.model, st.placement);
  p.kept_layers = kept;
  p.hbm_cap = r.profile.hbm_bytes;
  p.dram_cap = r.profile.dram_bytes;
  p.nvme_cap = r.profile.nvme_bytes;
  return p;
}

Candidate score(const Instance& in, Plan p, const std::string& name) {
  Candidate c;
  c.name = name;
  p.planner = name;
  try {
    c.sim = simulate(in, p, true);
    c.feasible = c.sim.fits;
    c.why = c.sim.violation;
  } catch (const Error& e) {
    c.feasible = false;
    c.why = e.what();
  }
  if (c.feasible) {
    p.predicted = c.sim.pred;
  }
  c.plan = std::move(p);
  return c;
}

// A state choice with its instance and the DP's plan at the largest chunk that works.
struct Prepared {
  StateChoice st;
  Instance inst;
  DpResult dp;
  int64_t chunk = 0;
  double step = 1e300;  // simulated step of the DP's plan (hybrid 8-bit comparison)
};

// The tiers the requested planner gives a prepared choice: a heuristic's own (its plan is the one that runs), else
// the DP's (the MILP's plan is never worse than the DP's).
std::vector<Tier> planner_tiers(const PlanRequest& r, const Prepared& pr) {
  return is_heuristic(r.planner) ? heuristic_tiers(r.planner, pr.inst.L) : pr.dp.tier;
}

// The simulated step of the requested planner's plan for a prepared choice (planner_tiers, its tied traffic
// assigned); 1e300 when the DP has none or the plan does not fit. opt_scale > 1: with the CPU optimizer that much
// slower (kOptimizerMargin). The searches below (8-bit set, layers updated on the GPU, kept internals) score their
// counts with it, so that what they take from the HBM leaves room for the requested planner's checkpoints.
double simulated_step(const PlanRequest& r, const Prepared& pr, double opt_scale = 1.0) {
  if (!pr.dp.feasible) return 1e300;
  Plan p = plan_meta(r, pr.chunk, pr.st, pr.inst.kept);
  p.tier = planner_tiers(r, pr);
  assign_tied_traffic(pr.inst, p);
  Instance in = pr.inst;
  for (double& t : in.opt) t *= opt_scale;
  const SimResult sim = simulate(in, p);
  return sim.fits ? sim.pred.step_s : 1e300;
}

// The CPU optimizer's rate in training against the profile's (derated) figure: 0.89-1.0 in the steady steps of runs
// 73-82 (H200 host, 8-bit), single steps lower. The count of layers updated on the GPU is chosen for a rate this
// much slower, so that a slow step still finds its updates done (the exposed optimizer is a small difference of
// two ~0.3 s figures at 3B).
constexpr double kOptimizerMargin = 1.2;

// Chunk: the whole batch if the DP finds a plan with it, else halve.
Prepared prepare(const PlanRequest& r, StateChoice st) {
  st.placement.head_grad_slices = st.placement.head_grad_slices && head_grad_slices_apply(r.model, st.placement);
  InstanceOptions io;
  io.ring = r.ring;
  io.micro_batches = r.micro_batches;
  io.optimizer_8bit = st.q8;
  io.placement = st.placement;
  io.collectives = r.collectives;
  io.embedding_rows_first = r.embedding_rows_first;
  io.attention_fraction = r.attention_fraction;
  Prepared pr;
  pr.st = std::move(st);
  pr.chunk = r.chunk > 0 ? std::min(r.chunk, r.batch) : r.batch;
  for (;;) {
    io.chunk = pr.chunk;
    pr.inst = make_instance(r.model, r.batch, r.seq, r.profile, io);
    pr.dp = solve_dp(pr.inst.solver_view());
    if (pr.dp.feasible || r.chunk > 0 || pr.chunk == 1) break;
    pr.chunk = (pr.chunk + 1) / 2;
  }
  return pr;
}

// The rung planned when none works, for the "does not fit" message: the last one whose state fits (the DP then
// names what the activations lack), else the last.
const StateChoice& fallback_rung(const PlanRequest& r, const std::vector<StateChoice>& ladder) {
  for (size_t k = ladder.size(); k-- > 0;)
    if (state_fits(r, ladder[k])) return ladder[k];
  return ladder.back();
}

// The placement ladder: the first level with a rung whose state fits and whose DP finds a plan; of several such rungs,
// the one whose plan (the requested planner's tiers) simulates fastest (ties: the earlier rung), or with
// PlanRequest::fastest_placement off the first of them.
Prepared choose_state(const PlanRequest& r) {
  const auto ladder = placement_ladder(r);
  std::optional<Prepared> best;
  int best_level = -1;
  for (const StateChoice& st : ladder) {
    if (best && st.level != best_level) break;
    if (!state_fits(r, st)) continue;
    Prepared pr = prepare(r, st);
    if (!pr.dp.feasible) continue;
    if (!r.fastest_placement) return pr;
    pr.step = simulated_step(r, pr);
    if (!best || pr.step < best->step * (1 - 1e-6)) {
      best_level = st.level;
      best = std::move(pr);
    }
  }
  if (best) return std::move(*best);
  return prepare(r, fallback_rung(r, ladder));
}

// Hybrid: the minimal 8-bit set leaves no DRAM for CPU checkpoints. Also try switching more tensors
// to free room for k boundaries, and keep the set whose DP plan simulates fastest.
void widen_8bit(const PlanRequest& r, Prepared& best) {
  if (r.optimizer != "hybrid" || best.st.q8.empty()) return;
  const auto& c = r.model;
  const double A = double(r.batch * r.seq * c.hidden * 2);
  auto score_prep = [&](Prepared& pr) {
    if (pr.dp.feasible) pr.step = simulated_step(r, pr);
  };
  score_prep(best);
  for (int k : {std::max(1, int(c.layers) / 4), std::max(1, int(c.layers) / 2), int(c.layers)}) {
    StateChoice st{best.st.placement, choose_8bit(c, "hybrid", double(r.profile.dram_bytes) - k * A, best.st.placement)};
    if (st.q8.size() == best.st.q8.size()) continue;
    Prepared pr = prepare(r, std::move(st));
    score_prep(pr);
    if (pr.step < best.step * (1 - 1e-6)) best = std::move(pr);
  }
}

// base's state with the first k layers updated on the GPU, prepared at base's chunk.
Prepared with_device_layers(const PlanRequest& r, const Prepared& base, int64_t k) {
  PlanRequest at_chunk = r;
  at_chunk.chunk = base.chunk;
  StateChoice st = base.st;
  st.placement.device_update_layers = k;
  return prepare(at_chunk, std::move(st));
}

// Layers updated on the GPU (StatePlacement::device_update_layers): the first k layers' weights, gradients and
// optimizer state in HBM, their updates on the GPU once the norm is known. The next forward's first k layers then do
// not wait for the CPU optimizer, which starts on layer k at once: its lag behind the forward (each layer's update a
// little slower than its forward, Qwen2.5-3B) has k forwards to hide in. The HBM comes from the checkpoints' and
// the kept internals' room, so as with those the trade is only known after planning: the DP for k = 1, 2, ... (at
// the chosen chunk), scored by the simulator, the fastest k kept when it beats k - 1 by more than 1e-6 relative;
// the search ends after 4 counts without a gain (the step only falls while the optimizer is exposed), at the HBM cap
// or at the layers whose moments are on NVMe. A forced k (PlanRequest::device_update_layers) is planned as given.
void choose_device_layers(const PlanRequest& r, Prepared& best, double opt_scale) {
  if (!best.dp.feasible || r.device_update_layers == int64_t(0)) return;
  const std::string why = layer_update_blocker(r, best.st);
  const int64_t kmax = r.model.layers - best.st.placement.nvme_layers;
  auto prepared = [&](int64_t k) { return with_device_layers(r, best, k); };
  if (r.device_update_layers) {
    const int64_t k = *r.device_update_layers;
    LT_CHECK(why.empty(), "plan: device_update_layers {}: {} (use device_update_layers 0 or auto)", k, why);
    LT_CHECK(k >= 0 && k <= kmax, "plan: device_update_layers {} outside [0, {}] (the model's layers{})", k, kmax,
             kmax < r.model.layers ? ", less those whose moments are on NVMe" : "");
    best = prepared(k);
    best.step = simulated_step(r, best);
    return;
  }
  if (!why.empty()) return;
  const double base = simulated_step(r, best, opt_scale);
  double best_step = base;
  int64_t best_k = 0, misses = 0;
  std::optional<Prepared> chosen;
  for (int64_t k = 1; k <= kmax && misses < 4; ++k) {
    Prepared pr = prepared(k);
    if (pr.inst.hbm_fixed >= pr.inst.hbm_cap) break;  // more layers only take more
    const double step = simulated_step(r, pr, opt_scale);
    if (step < best_step * (1 - 1e-6)) {
      best_step = step;
      best_k = k;
      chosen = std::move(pr);
      misses = 0;
    } else {
      ++misses;
    }
  }
  if (best_k == 0) return;
  log_debug("plan: the first {} layers updated on the GPU: DP plan {:.2f} ms -> {:.2f} ms", best_k, base * 1e3,
            best_step * 1e3);
  best = std::move(*chosen);
  best.step = simulated_step(r, best);
}

void choose_kept(const PlanRequest& r, Prepared& best);

// Device layers and kept internals together. Both take HBM, and the kept search runs on what the device layers leave:
// the counts the device search gives at the profile's optimizer rate (k_lo) and at kOptimizerMargin times slower
// (k_hi) bound the candidates; each k in [k_lo, k_hi] gets its kept search, and the one whose step with the slower
// optimizer is shortest wins (ties: fewer layers on the GPU). At 7B a kept layer saves ~38 ms of re-run forward
// against ~10 ms of exposed optimizer a device layer hides, so the kept layers win there; at 3B the device layers do.
void choose_device_and_kept(const PlanRequest& r, Prepared& best) {
  Prepared lo = best;
  choose_device_layers(r, lo, 1.0);
  const int64_t k_lo = lo.st.placement.device_update_layers;
  int64_t k_hi = k_lo;
  if (!r.device_update_layers && lo.dp.feasible) {
    Prepared hi = best;
    choose_device_layers(r, hi, kOptimizerMargin);
    k_hi = std::max(k_lo, hi.st.placement.device_update_layers);
  }
  choose_kept(r, lo);
  if (k_hi == k_lo) {
    best = std::move(lo);
    return;
  }
  double best_step = simulated_step(r, lo, kOptimizerMargin);
  Prepared chosen = std::move(lo);
  for (int64_t k = k_lo + 1; k <= k_hi; ++k) {
    Prepared pr = with_device_layers(r, best, k);
    if (!pr.dp.feasible) continue;
    choose_kept(r, pr);
    const double step = simulated_step(r, pr, kOptimizerMargin);
    if (step < best_step * (1 - 1e-6)) {
      best_step = step;
      chosen = std::move(pr);
    }
  }
  log_debug("plan: {} layers updated on the GPU (searched {}..{})", chosen.st.placement.device_update_layers, k_lo, k_hi);
  best = std::move(chosen);
  best.step = simulated_step(r, best);
}

// Kept internals: the last k layers keep their forward internals in HBM, so their backward does not re-run the forward
// (beta_kept instead of beta), at keep_bytes of HBM each for the whole step (with_kept). That HBM is taken from the
// checkpoints' room, so a larger k can push boundaries off the GPU (or the plan out of the cap): the trade is only
// known after planning. Hence a search over k: the DP on each kept instance (cheap, ~0.05 s each; never the MILP),
// scored like widen_8bit (the DP's plan, tied traffic, the simulator), keeping the fastest k when it beats k = 0
// by more than 1e-6 relative (ties: fewer kept layers). The chosen instance and DP replace best's, so the
// heuristics, the MILP and the simulator all plan for it.
void choose_kept(const PlanRequest& r, Prepared& best) {
  if (!r.keep_internals || !best.dp.feasible || best.inst.kept != 0) return;
  const int tail = keepable_tail(best.inst);
  if (tail <= 0) return;
  auto step_of = [&](const Instance& in, const DpResult& dp) {
    Prepared pr{best.st, in, dp, best.chunk};
    return simulated_step(r, pr);
  };
  const double base = step_of(best.inst, best.dp);
  double best_step = base;
  int best_k = 0;
  std::optional<Instance> best_inst;
  DpResult best_dp;
  for (int k = 1; k <= tail; ++k) {
    Instance in = with_kept(best.inst, k);
    if (in.hbm_fixed >= in.hbm_cap) break;  // more kept layers only take more
    DpResult dp = solve_dp(in.solver_view());
    const double step = step_of(in, dp);
    if (step < best_step * (1 - 1e-6)) {
      best_step = step;
      best_k = k;
      best_inst = std::move(in);
      best_dp = std::move(dp);
    }
  }
  if (best_k == 0) return;
  log_debug("plan: keeping the internals of the last {} layers: DP plan {:.2f} ms -> {:.2f} ms", best_k, base * 1e3,
            best_step * 1e3);
  best.inst = std::move(*best_inst);
  best.dp = std::move(best_dp);
  best.step = best_step;
}

// Nothing fits: name the tightest resource. For a heuristic planner its own plan's shortfall; else the plan space's
// smallest HBM footprint.
std::string why_not(const PlanRequest& r, const PlanOutcome& out, const StateChoice& st, int64_t chunk) {
  const Instance& in = out.inst;
  if (in.dram_fixed > in.dram_cap)
    return fmt::format("does not fit: dram short by {} (needs {} for the model state with {}, has {})",
                       format_bytes(in.dram_fixed - in.dram_cap), format_bytes(in.dram_fixed), describe_choice(st),
                       format_bytes(in.dram_cap));
  const double floor_hbm = in.hbm_fixed + in.ring + in.max_ws_bwd() + 3 * in.A;
  if (floor_hbm > in.hbm_cap)
    return fmt::format("does not fit: gpu short by {} (needs {} for the {}weight ring, the largest layer's backward and 3 "
                       "boundaries at chunk {}, has {})", format_bytes(floor_hbm - in.hbm_cap), format_bytes(floor_hbm),
                       in.hbm_fixed > 0 ? fmt::format("model state held in HBM ({}), the ", format_bytes(in.hbm_fixed))
                                        : std::string(),
                       chunk, format_bytes(in.hbm_cap));
  // The floor fits: the other boundaries have no home. The candidate needing the least HBM says where it fell short.
  std::string why = fmt::format("does not fit: the GPU's floor at chunk {} fits ({} of {}), but the other boundaries ({} "
                                "each), recomputed or offloaded, find no room: the rest of HBM, dram {} left after the "
                                "model state, nvme {} (staged through dram)",
                                chunk, format_bytes(floor_hbm), format_bytes(in.hbm_cap), format_bytes(in.A),
                                format_bytes(std::max(0.0, in.dram_cap - in.dram_fixed)), format_bytes(in.nvme_cap));
  const Candidate* least = nullptr;
  for (auto& cd : out.candidates)
    if ((!is_heuristic(r.planner) || cd.name == r.planner) && cd.why.rfind("does not fit: ", 0) == 0 &&
        cd.sim.pred.peak_hbm > 0 && (!least || cd.sim.pred.peak_hbm < least->sim.pred.peak_hbm))
      least = &cd;
  if (least) why += fmt::format("; the plan needing the least HBM ({}): {}", least->name, least->why.substr(14));
  return why;
}

}  // namespace

namespace {

// The chosen state's figures in the outcome: placement, bytes, the 8-bit count, the instance, the DP.
void record_state(const PlanRequest& r, const Prepared& prep, PlanOutcome& out) {
  const auto& c = r.model;
  out.placement = prep.st.placement;
  out.state = model_state_bytes(c, prep.st.q8, prep.st.placement);
  const auto lay = model_layout(c);
  for (auto& n : prep.st.q8) {
    ++out.eight_bit_tensors;
    for (auto& u : lay.units)
      for (auto& p : u.params)
        if (p.name == n) out.eight_bit_params += p.numel;
  }
  out.inst = prep.inst;
  out.dp = prep.dp;
}

// Every plan the request asks to score: the DP's, the heuristics (all of them with compare, the
// requested one, and all-gpu for milp: one simulation, the tie-break's candidate), for milp the tiers of `carried`
// (a plan of the same chunk under a tighter model state: they fit here too), then the MILP warm-started from the best
// so far.
void score_candidates(const PlanRequest& r, const Plan& meta, PlanOutcome& out, const Plan* carried = nullptr) {
  const Instance& in = out.inst;
  auto with_tiers = [&](std::vector<Tier> t) {
    Plan p = meta;
    p.tier = std::move(t);
    assign_tied_traffic(in, p);
    return p;
  };
  const DpResult& dp = *out.dp;  // record_state
  if (dp.feasible) out.candidates.push_back(score(in, with_tiers(dp.tier), "dp"));
  else out.candidates.push_back({"dp", false, "no feasible plan in the DP's space", meta, {}});
  if (r.compare || is_heuristic(r.planner) || r.planner == "milp") {
    std::vector<std::string> names = heuristic_names();
    if (is_heuristic(r.planner) && std::find(names.begin(), names.end(), r.planner) == names.end()) names.push_back(r.planner);
    for (auto& h : names) {
      if (!r.compare && h != r.planner && !(r.planner == "milp" && h == "all-gpu")) continue;
      out.candidates.push_back(score(in, with_tiers(heuristic_tiers(h, in.L)), h));
    }
  }
  if (r.planner != "milp") {
    LT_CHECK(r.planner == "dp" || is_heuristic(r.planner), "unknown planner '{}': expected milp, dp, megatrain:K, all-gpu, "
             "sqrt or cpu-all", r.planner);
    return;
  }
  if (carried && carried->chunk == meta.chunk && carried->tier.size() == size_t(in.L + 1))
    out.candidates.push_back(score(in, with_tiers(carried->tier), "deeper ring"));
  const Candidate* best = nullptr;
  for (auto& cd : out.candidates)
    if (cd.feasible && (!best || cd.sim.pred.step_s < best->sim.pred.step_s)) best = &cd;
  auto ms = solve_milp(in.solver_view(), r.milp, best ? &best->plan : nullptr);
  out.milp = ms;
  if (ms.feasible) {
    Plan p = meta;
    p.tier = ms.tier;
    apply_milp_solution(in, ms, p);
    out.candidates.push_back(score(in, p, "milp"));
  } else {
    out.candidates.push_back({"milp", false, "CBC found no solution within the time limit", meta, {}});
  }
}

// The requested planner's plan, except that milp takes the best of everything it was compared with (it
// may only improve on the DP and the heuristics). Fastest wins; on a tie (within 1e-9 relative) the one
// whose fuller memory (GPU or DRAM, as a share of its cap) is emptier: checkpoints offloaded for nothing
// cost host memory (RSS) and PCIe traffic. Null when none is feasible.
const Candidate* choose_candidate(const PlanRequest& r, const PlanOutcome& out) {
  const Instance& in = out.inst;
  auto fullest = [&](const Candidate& x) {
    return std::max(double(x.sim.pred.peak_hbm) / std::max(1.0, in.hbm_cap),
                    double(x.sim.pred.peak_dram) / std::max(1.0, in.dram_cap));
  };
  const Candidate* best = nullptr;
  for (auto& cd : out.candidates) {
    if (!cd.feasible || (r.planner != "milp" && cd.name != r.planner)) continue;
    const double tol = 1e-9 * (best ? best->sim.pred.step_s : 0);
    if (!best || cd.sim.pred.step_s < best->sim.pred.step_s - tol ||
        (cd.sim.pred.step_s <= best->sim.pred.step_s + tol && fullest(cd) < fullest(*best)))
      best = &cd;
  }
  return best;
}

// What the moments' NVMe I/O costs the chosen plan (PlanOutcome::nvme_moments_io_s, nvme_moments_cost_s).
void nvme_moments_cost(PlanOutcome& out) {
  if (out.inst.nvme_read.empty()) return;
  out.nvme_moments_io_s = out.inst.nvme_io_s();
  Instance free_io = out.inst;
  std::fill(free_io.nvme_read.begin(), free_io.nvme_read.end(), 0.0);
  std::fill(free_io.nvme_write.begin(), free_io.nvme_write.end(), 0.0);
  out.nvme_moments_cost_s = out.sim.pred.step_s - simulate(free_io, out.plan).pred.step_s;
}

}  // namespace

namespace {

// The plan for a chosen model state: the device-updated layers and kept internals, the candidates (the MILP's
// included), the fastest of them.
PlanOutcome plan_state(const PlanRequest& r, Prepared prep, const Plan* carried = nullptr) {
  PlanOutcome out;
  out.flops_per_step = model_flops_per_step(r.model, r.batch * r.seq * r.micro_batches);
  StepRows rows = full_rows(r.batch * r.micro_batches, r.seq);
  rows.sum_sq_len *= r.attention_fraction;  // packed rows: the segments' squares
  out.flops_attn_per_step = model_flops_with_attention(r.model, rows);
  choose_device_and_kept(r, prep);
  record_state(r, prep, out);
  score_candidates(r, plan_meta(r, prep.chunk, prep.st, prep.inst.kept), out, carried);
  const Candidate* best = choose_candidate(r, out);
  if (!best) {
    out.why = why_not(r, out, prep.st, prep.chunk);
    if (r.explain) out.why += fit_advice(r).text();
    return out;
  }
  out.feasible = true;
  out.plan = best->plan;
  out.plan.planner = r.planner == "milp" && best->name != "milp" ? "milp(" + best->name + ")" : best->name;
  out.sim = best->sim;
  out.chosen = best->name;
  out.sim.pred.tflops = out.flops_per_step / out.sim.pred.step_s / 1e12;
  out.plan.predicted = out.sim.pred;
  for (auto& cd : out.candidates)
    if (cd.feasible) cd.sim.pred.tflops = out.flops_per_step / cd.sim.pred.step_s / 1e12;
  nvme_moments_cost(out);
  return out;
}

// The held gradients' staging ring (StatePlacement::grad_ring_depth) when the request leaves it to the planner
// (PlanRequest::grad_ring_depth 0): each unit less leaves a layer's gradient of DRAM to the checkpoints (and so to
// larger chunks), at the price the simulator gives a bounded ring. The whole plan (the MILP's too: the DP alone does
// not see what NVMe checkpoints at larger chunks give) at 4 and 2 units beside 8, each MILP also offered the deeper
// ring's checkpoints (a time-limited solve can miss them); the fastest predicted step wins (ties: the deeper ring).
void try_shallower_rings(const PlanRequest& r, const Prepared& deep, PlanOutcome& out) {
  if (r.grad_ring_depth != 0 || deep.st.placement.grads != GradHome::Device) return;
  for (int depth : {4, 2}) {
    StateChoice st = deep.st;
    st.placement.grad_ring_depth = depth;
    if (!state_fits(r, st)) continue;
    Prepared pr = prepare(r, std::move(st));
    if (!pr.dp.feasible) continue;
    PlanOutcome o = plan_state(r, std::move(pr), out.feasible ? &out.plan : nullptr);
    if (o.feasible && (!out.feasible || o.sim.pred.step_s < out.sim.pred.step_s * (1 - 1e-6))) out = std::move(o);
  }
  log_debug("plan: gradient ring depth {}", out.placement.grad_ring_depth);
}

// The ladder's state (placement.h), its plan and, where asked, its ring depths.
PlanOutcome plan_ladder(const PlanRequest& r) {
  Prepared prep = choose_state(r);
  widen_8bit(r, prep);
  PlanOutcome out = plan_state(r, prep);
  try_shallower_rings(r, prep, out);
  return out;
}

}  // namespace

PlanOutcome make_plan(const PlanRequest& r) {
  LT_CHECK(r.batch >= 1, "plan: batch must be >= 1, got {}", r.batch);
  LT_CHECK(r.world >= 1 && r.ranks_per_host >= 1 && r.ranks_per_host <= r.world,
           "plan: world size must be >= 1 and ranks per host in [1, world], got world {} and ranks per host {}",
           r.world, r.ranks_per_host);
  PlanOutcome out = plan_ladder(r);
  // The head's gradient by vocabulary slices (StatePlacement::head_grad_slices) left to the planner: the whole ladder
  // again with them on every rung where they apply. Their HBM (the [vocab, hidden] fp32 buffers) may let an earlier
  // rung fit or run larger chunks, for one more logits GEMM; a later rung (NVMe moments) may still be faster, so the
  // two ladders' plans are compared (ties: without).
  // Only where some rung can take them (head_grad_slices_apply on the most the request leaves open): gradients not
  // forced to the host or fp32, no data parallel (host gradients only).
  StatePlacement most;
  most.grads = r.grads.value_or(GradHome::Device);
  most.grad_dtype = r.grad_dtype.value_or(GradDType::Bf16);
  if (!r.head_grad_slices && r.world == 1 && head_grad_slices_apply(r.model, most)) {
    PlanRequest sliced = r;
    sliced.head_grad_slices = true;
    PlanOutcome o = plan_ladder(sliced);
    if (o.feasible && o.placement.head_grad_slices &&
        (!out.feasible || o.sim.pred.step_s < out.sim.pred.step_s * (1 - 1e-6)))
      out = std::move(o);
    log_debug("plan: head gradient by slices {}", out.placement.head_grad_slices);
  }
  return out;
}

namespace {

// Largest k in [1, hi] with ok(k), for ok true up to some k and false above; 0 if ok(1) is false. Doubles, then
// bisects: about 2 log2(answer) calls.
int64_t largest_ok(const std::function<bool(int64_t)>& ok, int64_t hi) {
  if (hi < 1 || !ok(1)) return 0;
  int64_t lo = 1, up = 2;
  while (up <= hi && ok(up)) {
    lo = up;
    up *= 2;
  }
  up = std::min(up, hi + 1);
  while (up - lo > 1) {
    const int64_t mid = (lo + up) / 2;
    (ok(mid) ? lo : up) = mid;
  }
  return lo;
}

// The request as a feasibility search asks it: no comparison or explanation, any rung that works, no kept internals
// (keeping only adds HBM), the DP in place of the MILP (the same feasibility, faster).
PlanRequest feasibility_request(PlanRequest r, const std::string& planner) {
  r.compare = false;
  r.explain = false;
  r.fastest_placement = false;
  r.keep_internals = false;
  r.planner = planner == "milp" ? "dp" : planner;
  return r;
}
}  // namespace

int64_t max_feasible_batch(PlanRequest r, const std::string& planner, int64_t hi) {
  r = feasibility_request(std::move(r), planner);
  return largest_ok(
      [&](int64_t b) {
        r.batch = b;
        return make_plan(r).feasible;
      },
      hi);
}

int64_t max_feasible_seq(PlanRequest r, const std::string& planner, int64_t granule, int64_t hi) {
  LT_CHECK(granule >= 1 && hi >= granule, "max_feasible_seq: granule must be >= 1 and <= hi, got granule {} and hi {}",
           granule, hi);
  r = feasibility_request(std::move(r), planner);
  auto ok = [&](int64_t k) {
    r.seq = k * granule;
    return make_plan(r).feasible;
  };
  return largest_ok(ok, hi / granule) * granule;
}

}  // namespace lt
