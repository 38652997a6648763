#include "plan/simulator.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/units.h"

namespace lt {

const char* sim_lane_name(SimLane l) {
  switch (l) {
    case SimLane::Compute: return "GPU compute";
    case SimLane::H2D: return "H2D";
    case SimLane::D2H: return "D2H";
    case SimLane::NvmeRead: return "NVMe read";
    case SimLane::NvmeWrite: return "NVMe write";
    case SimLane::Optimizer: return "CPU optimizer";
    default: return "?";
  }
}

namespace {
// Block (s,e) containing layer j.
struct BlockOf {
  std::vector<int> start, end;
};
BlockOf block_of_layers(const Plan& p) {
  BlockOf b;
  const int L = int(p.layers);
  b.start.resize(size_t(L));
  b.end.resize(size_t(L));
  for (auto& bl : blocks_from_tiers(p.tier))
    for (int j = bl.start; j < bl.end; ++j) {
      b.start[size_t(j)] = bl.start;
      b.end[size_t(j)] = bl.end;
    }
  return b;
}
}  // namespace

std::vector<int> window_slots(const Instance& in, const Plan& p) {
  auto bo = block_of_layers(p);
  std::vector<int> r;
  for (auto& w : plan_windows(p)) {
    switch (w.kind) {
      case PlanWindowKind::Forward: r.push_back(in.slot_F(w.layer)); break;
      case PlanWindowKind::Head: r.push_back(in.slot_H()); break;
      case PlanWindowKind::Recompute: r.push_back(in.slot_B(bo.end[size_t(w.layer)] - 1)); break;
      case PlanWindowKind::Backward: r.push_back(in.slot_B(w.layer)); break;
    }
  }
  return r;
}

std::vector<SlotTraffic> plan_slot_traffic(const Instance& in, const Plan& p) {
  const int L = in.L;
  LT_CHECK(p.layers == L, "simulate: plan has {} layers, the instance {}", p.layers, L);
  std::vector<SlotTraffic> s(size_t(in.slots()));
  for (int j = 0; j < L; ++j) {
    auto& f = s[size_t(in.slot_F(j))];
    f.C = in.rho[size_t(j)];
    f.h = in.h_F(j);
  }
  auto& hd = s[size_t(in.slot_H())];
  hd.C = in.head_s;
  hd.h = in.h_H();
  for (auto& b : blocks_from_tiers(p.tier)) {
    for (int j = b.start; j < b.end; ++j) {
      auto& x = s[size_t(in.slot_B(j))];
      x.C = in.beta[size_t(j)];
      x.h = in.h_B(j);
      x.d = in.d_B(j);
    }
    auto& first = s[size_t(in.slot_B(b.end - 1))];
    first.recompute = in.R(b.start, b.end);
    first.C += first.recompute;
    first.h += in.R_bytes(b.start, b.end);
  }
  auto ws = window_slots(in, p);
  auto add = [&](const std::vector<Share>& v, double SlotTraffic::*lane) {
    for (auto& x : v) s[size_t(ws[size_t(x.window)])].*lane += x.fraction * in.A;
  };
  for (auto& t : p.traffic) {
    add(t.d2h, &SlotTraffic::d);
    add(t.h2d, &SlotTraffic::h);
    add(t.nvme_read, &SlotTraffic::r);
    add(t.nvme_write, &SlotTraffic::w);
  }
  return s;
}

std::string slot_name(const Instance& in, int w) {
  const int L = in.L;
  if (w == L) return "H";
  const int j = w < L ? w : 2 * L - w;
  std::string n = fmt::format("{}{}", w < L ? 'F' : 'B', j);
  // Mixed kinds: the layer's kind as a letter (A attention, D DeltaNet).
  const bool mixed = std::any_of(in.kind.begin(), in.kind.end(), [&](LayerKind k) { return k != in.kind.front(); });
  if (mixed) n += in.kind_of(j) == LayerKind::Attention ? " A" : " D";
  return n;
}

namespace {

// Exposed time ex of a slot with traffic x, charged to its slowest lane (PCIe: the direction with more
// bytes per bandwidth; else NVMe).
void charge_exposure(const Instance& in, const SlotTraffic& x, double ex, double& h2d, double& d2h, double& nvme) {
  if (ex <= 0) return;
  const double tp = in.pcie(x.h, x.d), tr = x.r / in.bnr, tw = x.w / in.bnw;
  if (tp >= tr && tp >= tw) (x.h / in.bh >= x.d / in.bd ? h2d : d2h) += ex;
  else nvme += ex;
}

// The plan's checkpoint transfers on the NVMe lanes, which the moments' I/O queue shares (CheckpointNvmeIo).
CheckpointNvmeIo checkpoint_nvme_io(const Instance& in, const std::vector<SlotTraffic>& slots) {
  CheckpointNvmeIo ck;
  ck.lead = in.step_prologue() + in.prologue();
  ck.prologue_s = in.prologue();
  ck.epilogue_s = in.epilogue();
  for (const auto& x : slots) {
    ck.slot_s.push_back(in.slot_time(x.C, x.h, x.d, x.r, x.w));
    ck.read_s.push_back(x.r / in.bnr);
    ck.write_s.push_back(x.w / in.bnw);
  }
  return ck;
}

// The step's timeline: prologue, the slots in order (each waits for its layer's optimizer update O), the
// epilogue, later micro-batches, the last update (opt_last). Fills R.pred's times, R.slot_start / slot_time,
// R.step_no_opt_s and (record_ops) R.ops.
void simulate_time(const Instance& in, const std::vector<double>& O, double opt_last, bool record_ops, SimResult& R) {
  const int L = in.L, S = in.slots();
  auto& pr = R.pred;
  auto op = [&](SimLane l, double a, double b, std::string lab, bool ex = false, int kind = -1) {
    if (record_ops && b > a) R.ops.push_back({l, a, b, std::move(lab), ex, kind});
  };
  if (record_ops) {
    double d = 0;
    for (size_t uu : in.opt_order()) {
      const int u = int(uu);
      std::string lab = u < L ? fmt::format("opt {}", u) : (u == L ? "opt head" : "opt emb");
      op(SimLane::Optimizer, O[size_t(u)] - in.opt[size_t(u)], O[size_t(u)], lab);
      if (size_t(u) < in.opt_d2h.size()) op(SimLane::D2H, d, d + in.opt_d2h[size_t(u)], "held grad " + lab.substr(4));
      if (size_t(u) < in.opt_d2h.size()) d += in.opt_d2h[size_t(u)];
    }
  }
  // The GPU's own updates (embedding, first layers) come first; the CPU optimizer runs beside them.
  double t = std::max(O[0], in.device_update_s);
  if (in.device_update_s > 0) op(SimLane::Compute, 0, in.device_update_s, "device updates");
  // Data parallelism: the weight all-gather, once per step, before the first prologue.
  const double spro = in.step_prologue();
  if (spro > 0) {
    op(SimLane::H2D, t, t + spro, "weight all-gather");
    op(SimLane::D2H, t, t + spro, "weight all-gather");
    (in.coll.weight_h2d / in.bh >= in.coll.weight_d2h / in.bd ? pr.exposed_h2d_s : pr.exposed_d2h_s) += spro;
    t += spro;
  }
  const double pro = in.prologue();
  op(SimLane::H2D, t, t + pro, "layer 0 + boundary 0");
  op(SimLane::Compute, in.device_update_s, t + pro, "wait (optimizer, prologue)", true);
  pr.exposed_optimizer_s += std::max(0.0, O[0] - in.device_update_s);
  pr.exposed_h2d_s += pro;
  t += pro;
  double t_no_opt = pro;
  R.slot_start.resize(size_t(S));
  R.slot_time.resize(size_t(S));
  for (int w = 0; w < S; ++w) {
    const auto& x = R.slots[size_t(w)];
    const double wait = w < L ? O[size_t(w + 1 <= L - 1 ? w + 1 : L)] : 0.0;
    const double start = std::max(t, wait);
    if (start > t) {
      op(SimLane::Compute, t, start, "wait optimizer", true);
      pr.exposed_optimizer_s += start - t;
    }
    const double T = in.slot_time(x.C, x.h, x.d, x.r, x.w);
    R.slot_start[size_t(w)] = start;
    R.slot_time[size_t(w)] = T;
    charge_exposure(in, x, T - x.C, pr.exposed_h2d_s, pr.exposed_d2h_s, pr.exposed_nvme_s);
    pr.compute_s += x.C - x.recompute;
    pr.recompute_s += x.recompute;
    if (record_ops) {
      const double tp = in.pcie(x.h, x.d);
      std::string name = slot_name(in, w);
      if (x.recompute > 0) name += "+R";
      op(SimLane::Compute, start, start + x.C, name, false, w == L ? -1 : int(in.kind_of(w < L ? w : 2 * L - w)));
      op(SimLane::Compute, start + x.C, start + T, name + " stall", true);
      op(SimLane::H2D, start, start + (x.h > 0 ? tp : 0), name);
      op(SimLane::D2H, start, start + (x.d > 0 ? tp : 0), name);
      op(SimLane::NvmeRead, start, start + x.r / in.bnr, name);
      op(SimLane::NvmeWrite, start, start + x.w / in.bnw, name);
    }
    t = start + T;
    t_no_opt += T;
  }
  const double epi = in.epilogue();
  op(SimLane::D2H, t, t + epi, "layer 0 grad + boundary-0 grad");
  op(SimLane::Compute, t, t + epi, "epilogue", true);
  pr.exposed_d2h_s += epi;
  t += epi;
  t_no_opt += epi;
  if (in.micro_batches > 1) {
    // Later micro-batches repeat the same slots without optimizer waits.
    const double k = double(in.micro_batches - 1);
    t += k * t_no_opt;
    pr.compute_s *= double(in.micro_batches);
    pr.recompute_s *= double(in.micro_batches);
    double ex_h = 0, ex_d = 0, ex_n = 0;
    for (int w = 0; w < S; ++w)
      charge_exposure(in, R.slots[size_t(w)], R.slot_time[size_t(w)] - R.slots[size_t(w)].C, ex_h, ex_d, ex_n);
    pr.exposed_h2d_s += k * (ex_h + pro);
    pr.exposed_d2h_s += k * (ex_d + epi);
    pr.exposed_nvme_s += k * ex_n;
    t_no_opt *= double(in.micro_batches);
  }
  // Data parallelism: the gradient reduce-scatter, once per step, after the last epilogue.
  const double sepi = in.step_epilogue();
  if (sepi > 0) {
    op(SimLane::D2H, t, t + sepi, "gradient reduce-scatter");
    op(SimLane::H2D, t, t + sepi, "gradient reduce-scatter");
    op(SimLane::Compute, t, t + sepi, "collectives", true);
    (in.coll.grad_h2d / in.bh >= in.coll.grad_d2h / in.bd ? pr.exposed_h2d_s : pr.exposed_d2h_s) += sepi;
    t += sepi;
  }
  t_no_opt += spro + sepi + in.device_update_s;
  if (opt_last > t) {  // an update still running at the step's end (the next step waits for it)
    pr.exposed_optimizer_s += opt_last - t;
    t = opt_last;
  }
  pr.step_s = t;
  R.step_no_opt_s = t_no_opt;
}

// Per plan window figures: its compute, and its slot's transfers and exposure at the slot's first window.
void window_figures(const Instance& in, const Plan& p, const std::vector<int>& ws, double O0, SimResult& R) {
  const int S = in.slots();
  const double first_start = O0 + in.prologue();
  std::vector<int> first_of_slot(size_t(S), -1);
  for (size_t k = 0; k < ws.size(); ++k)
    if (first_of_slot[size_t(ws[k])] < 0) first_of_slot[size_t(ws[k])] = int(k);
  auto wins = plan_windows(p);
  auto& pr = R.pred;
  pr.windows.assign(wins.size(), {});
  for (size_t k = 0; k < wins.size(); ++k) {
    auto& wp = pr.windows[k];
    const int sl = ws[k];
    const auto& x = R.slots[size_t(sl)];
    const auto& wi = wins[k];
    wp.compute = wi.kind == PlanWindowKind::Forward || wi.kind == PlanWindowKind::Recompute ? in.rho[size_t(wi.layer)]
                 : wi.kind == PlanWindowKind::Head                                          ? in.head_s
                                                                                            : in.beta[size_t(wi.layer)];
    if (first_of_slot[size_t(sl)] != int(k)) continue;
    const double tp = in.pcie(x.h, x.d);
    wp.h2d = x.h > 0 ? tp : 0;
    wp.d2h = x.d > 0 ? tp : 0;
    wp.nvme_read = x.r / in.bnr;
    wp.nvme_write = x.w / in.bnw;
    const double prev_end = sl == 0 ? first_start : R.slot_start[size_t(sl - 1)] + R.slot_time[size_t(sl - 1)];
    wp.exposed = (R.slot_start[size_t(sl)] - prev_end) + (R.slot_time[size_t(sl)] - x.C);
  }
}

// GPU memory per slot (the fixed state, the ring, the boundaries present, the slot's working set),
// DRAM and NVMe, and whether they fit their caps.
void simulate_memory(const Instance& in, const Plan& p, const std::vector<int>& ws, SimResult& R) {
  const int L = in.L, S = in.slots(), nb = L + 1;
  auto& pr = R.pred;
  std::vector<std::vector<double>> dcum(static_cast<size_t>(nb)), hcum(static_cast<size_t>(nb));  // cumulative fraction by slot (inclusive)
  for (auto& tr : p.traffic) {
    auto& dc = dcum[size_t(tr.boundary)];
    auto& hc = hcum[size_t(tr.boundary)];
    dc.assign(size_t(S), 0);
    hc.assign(size_t(S), 0);
    for (auto& x : tr.d2h) dc[size_t(ws[size_t(x.window)])] += x.fraction;
    for (auto& x : tr.h2d) hc[size_t(ws[size_t(x.window)])] += x.fraction;
    for (int w = 1; w < S; ++w) {
      dc[size_t(w)] += dc[size_t(w - 1)];
      hc[size_t(w)] += hc[size_t(w - 1)];
    }
  }
  auto present = [&](int i, int w) {  // fraction of materialised boundary i on the GPU during slot w
    Tier t = p.tier[size_t(i)];
    if (t == Tier::Gpu) return 1.0;
    if (t == Tier::None) return 0.0;
    const double done_before = w > 0 ? dcum[size_t(i)][size_t(w - 1)] : 0.0;
    return (1.0 - done_before) + hcum[size_t(i)][size_t(w)];
  };
  auto bo = block_of_layers(p);
  R.slot_hbm.assign(size_t(S), 0);
  double peak = in.hbm_fixed + in.ring + in.ws_pro;
  for (int w = 0; w < S; ++w) {
    double m = in.hbm_fixed + in.ring;
    if (w < L) {
      const int j = w;
      for (int i = 0; i < j; ++i) m += in.A * present(i, w);
      m += 2 * in.A + in.ws_fwd[size_t(j)];
    } else if (w == L) {
      for (int i = 0; i < L; ++i) m += in.A * present(i, w);
      m += in.A + in.ws_head;
    } else {
      const int j = 2 * L - w, s = bo.start[size_t(j)];
      for (int i = 0; i <= s; ++i) m += in.A * present(i, w);
      m += in.A * double(j - s) + in.ws_bwd[size_t(j)];
    }
    R.slot_hbm[size_t(w)] = m;
    peak = std::max(peak, m);
  }
  int ncpu = 0, nnvme = 0;
  for (int i = 0; i <= L; ++i) {
    ncpu += p.tier[size_t(i)] == Tier::Cpu;
    nnvme += p.tier[size_t(i)] == Tier::Nvme;
  }
  R.dram = in.dram_fixed + in.A * ncpu + (nnvme > 0 ? 2.0 * in.staging * in.A : 0.0);
  R.nvme = in.A * nnvme;
  pr.peak_hbm = int64_t(std::ceil(peak));
  pr.peak_dram = int64_t(std::ceil(R.dram));
  pr.nvme_bytes = int64_t(std::ceil(R.nvme));
  auto short_by = [&](const char* tier, double need, double have) {
    R.fits = false;
    R.violation = fmt::format("does not fit: {} short by {} (needs {}, has {})", tier, format_bytes(need - have),
                              format_bytes(need), format_bytes(have));
  };
  if (peak > in.hbm_cap + 0.5) short_by("gpu", peak, in.hbm_cap);
  else if (R.dram > in.dram_cap + 0.5) short_by("dram", R.dram, in.dram_cap);
  else if (R.nvme > in.nvme_cap + 0.5) short_by("nvme", R.nvme, in.nvme_cap);
}

}  // namespace

SimResult simulate(const Instance& in, const Plan& p, bool record_ops) {
  validate_plan(p);
  SimResult R;
  R.slots = plan_slot_traffic(in, p);
  const auto ws = window_slots(in, p);
  // O[j] layer j, O[L] head, O[L+1] embedding; the moments' NVMe queue shares the lanes with the checkpoints.
  const auto ck = checkpoint_nvme_io(in, R.slots);
  auto O = in.opt_done(&ck);
  const SimResult base = R;
  simulate_time(in, O, in.opt_last(&ck), record_ops, R);
  // A bounded gradient ring frees a unit's slot only when the next forward has waited for it, and the forward's
  // waits depend on the updates: iterate from the unbounded ring's times (later slots only move later) until the
  // updates' ends stop moving. The NVMe-moment pipeline keeps its own model (the ring not bounded there).
  if (in.grad_ring_bytes > 0 && !in.opt_d2h.empty() && in.nvme_read.empty()) {
    for (int it = 0; it < 16; ++it) {
      std::vector<double> reach(O.size(), 0.0);  // the embedding and layer 0: waited for at the step's start
      for (int j = 1; j <= in.L; ++j) reach[size_t(j)] = R.slot_start[size_t(j - 1)];
      auto next = in.opt_done_ring(reach);
      if (next == O) break;
      O = std::move(next);
      R = base;
      simulate_time(in, O, *std::max_element(O.begin(), O.end()), record_ops, R);
    }
  }
  window_figures(in, p, ws, O[0], R);
  simulate_memory(in, p, ws, R);
  return R;
}

}  // namespace lt
