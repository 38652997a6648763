#include "plan/milp.h"

#include <CbcModel.hpp>
#include <CbcSolver.hpp>
#include <CoinPackedMatrix.hpp>
#include <OsiClpSolverInterface.hpp>
#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "plan/heuristics.h"
#include "plan/plan_env.h"
#include "plan/simulator.h"

namespace lt {

namespace {

using Expr = std::vector<std::pair<int, double>>;
const double kInf = COIN_DBL_MAX;

// Column/row builder for an OsiClpSolverInterface.
class Lp {
 public:
  int var(double lb, double ub, double obj, bool integer, std::string name) {
    lb_.push_back(lb);
    ub_.push_back(ub);
    obj_.push_back(obj);
    int_.push_back(integer);
    names_.push_back(std::move(name));
    return int(lb_.size()) - 1;
  }
  std::string label;  // set before adding rows, for diagnostics
  // k scales the whole row (coefficients and bounds): byte rows are written in boundary units so
  // that CBC sees coefficients near 1 (badly scaled rows gave invalid cuts).
  void row(const Expr& e, double lo, double hi, double k = 1.0) {
    labels_.push_back(label);
    std::map<int, double> m;
    for (auto& [c, v] : e) m[c] += v * k;
    if (lo > -1e29) lo *= k;
    if (hi < 1e29) hi *= k;
    std::vector<int> idx;
    std::vector<double> val;
    for (auto& [c, v] : m)
      if (v != 0) {
        idx.push_back(c);
        val.push_back(v);
      }
    rows_.emplace_back(std::move(idx), std::move(val));
    rlo_.push_back(lo);
    rhi_.push_back(hi);
  }
  void load(OsiClpSolverInterface& s) const {
    CoinPackedMatrix m(false, 0, 0);
    m.setDimensions(0, int(lb_.size()));
    for (auto& [i, v] : rows_) m.appendRow(int(i.size()), i.data(), v.data());
    s.loadProblem(m, lb_.data(), ub_.data(), obj_.data(), rlo_.data(), rhi_.data());
    for (int c = 0; c < int(lb_.size()); ++c) {
      if (int_[size_t(c)]) s.setInteger(c);
      s.setColName(c, names_[size_t(c)]);
    }
    // Clp's presolve copies row and column names together: give every row one too.
    for (int r = 0; r < int(rows_.size()); ++r) s.setRowName(r, fmt::format("r{}", r));
  }
  int ncols() const { return int(lb_.size()); }
  int nrows() const { return int(rows_.size()); }
  int nints() const { return int(std::count(int_.begin(), int_.end(), true)); }
  const std::string& name(int c) const { return names_[size_t(c)]; }

 private:
  std::vector<double> lb_, ub_, obj_, rlo_, rhi_;
  std::vector<bool> int_;
  std::vector<std::string> names_;
  std::vector<std::pair<std::vector<int>, std::vector<double>>> rows_;
  std::vector<std::string> labels_;

 public:
  // Rows violated by the point v (diagnostics / tests).
  std::vector<std::string> violations(const std::vector<double>& v, double tol) const {
    std::vector<std::string> out;
    for (int c = 0; c < ncols(); ++c)
      if (v[size_t(c)] < lb_[size_t(c)] - tol || v[size_t(c)] > ub_[size_t(c)] + tol)
        out.push_back(fmt::format("column {} = {} outside [{}, {}]", names_[size_t(c)], v[size_t(c)], lb_[size_t(c)], ub_[size_t(c)]));
    for (size_t r = 0; r < rows_.size(); ++r) {
      double a = 0;
      for (size_t k = 0; k < rows_[r].first.size(); ++k) a += rows_[r].second[k] * v[size_t(rows_[r].first[k])];
      const double scale = std::max({1.0, std::fabs(rlo_[r]) < 1e29 ? std::fabs(rlo_[r]) : 0.0, std::fabs(rhi_[r]) < 1e29 ? std::fabs(rhi_[r]) : 0.0});
      if (a < rlo_[r] - tol * scale || a > rhi_[r] + tol * scale)
        out.push_back(fmt::format("row {} '{}': {} not in [{}, {}]", r, labels_[r], a, rlo_[r], rhi_[r]));
    }
    return out;
  }
};

void add(Expr& e, const Expr& f, double k) {
  for (auto& [c, v] : f) e.emplace_back(c, v * k);
}

struct Model {
  const Instance& in;
  int L, S;
  Lp lp;
  std::vector<std::vector<int>> x;  // x[s][e], -1 when pruned
  std::vector<int> g, c, n;         // -1 when fixed/absent
  // Cumulative variables per boundary, indexed by slot; -1 outside their range.
  std::vector<std::vector<int>> D, W, Rd, H;
  std::vector<int> Dlo, Dhi, Wlo, Whi, Rlo, Rhi, Hlo, Hhi;
  std::vector<int> T, st, u;
  int y = -1, end = -1;

  explicit Model(const Instance& i) : in(i), L(i.L), S(i.slots()) {}

  // Cumulative fraction through slot w, clamped to the variable's range (0 before, last after).
  Expr cum(const std::vector<std::vector<int>>& V, const std::vector<int>& lo, const std::vector<int>& hi, int i,
           int w) const {
    if (lo[size_t(i)] < 0 || w < lo[size_t(i)]) return {};
    int k = std::min(w, hi[size_t(i)]);
    return {{V[size_t(i)][size_t(k)], 1.0}};
  }
  Expr Dc(int i, int w) const { return cum(D, Dlo, Dhi, i, w); }
  Expr Wc(int i, int w) const { return cum(W, Wlo, Whi, i, w); }
  Expr Rc(int i, int w) const { return cum(Rd, Rlo, Rhi, i, w); }
  Expr Hc(int i, int w) const { return cum(H, Hlo, Hhi, i, w); }
  Expr delta(const Expr& a, const Expr& b) const {
    Expr e = a;
    add(e, b, -1);
    return e;
  }
  Expr z(int i) const {
    Expr e;
    for (int v : {g[size_t(i)], c[size_t(i)], n[size_t(i)]})
      if (v >= 0) e.emplace_back(v, 1.0);
    return e;
  }
  Expr off(int i) const {
    Expr e;
    for (int v : {c[size_t(i)], n[size_t(i)]})
      if (v >= 0) e.emplace_back(v, 1.0);
    return e;
  }

  // The whole MILP, section by section; the order of variables and rows is the solver's input order.
  void build() {
    add_binaries();
    add_path_and_tier_links();
    add_cumulative_transfers();
    add_inner_boundary_counters();
    add_slot_times_and_chain();
    for (int w = 0; w < S; ++w) {
      add_slot_time_lanes(w);
      add_slot_hbm(w);
    }
    add_dram_and_nvme();
  }

  // ---- binaries: block choice x[s][e] and each boundary's tier (g device, c CPU, n NVMe)
  void add_binaries() {
    x.assign(size_t(L + 1), std::vector<int>(size_t(L + 1), -1));
    for (int s = 0; s < L; ++s)
      for (int e = s + 1; e <= L; ++e) {
        // Prune blocks whose working set cannot fit even with nothing else resident.
        if (in.block_floor(s, e) > in.hbm_room()) continue;
        x[size_t(s)][size_t(e)] = lp.var(0, 1, 0, true, fmt::format("x_{}_{}", s, e));
      }
    const double A = in.A;
    const double cpu_room = in.dram_cap - in.dram_fixed;
    const bool cpu_ok = cpu_room >= A;
    const bool nv_ok = in.allow_nvme && in.nvme_cap >= A && cpu_room >= 2.0 * in.staging * A;
    g.assign(size_t(L + 1), -1);
    c.assign(size_t(L + 1), -1);
    n.assign(size_t(L + 1), -1);
    for (int i = 1; i < L; ++i) {
      g[size_t(i)] = lp.var(0, 1, 0, true, fmt::format("g_{}", i));
      if (cpu_ok) c[size_t(i)] = lp.var(0, 1, 0, true, fmt::format("c_{}", i));
      if (nv_ok && i + 2 <= 2 * L - i - 1) n[size_t(i)] = lp.var(0, 1, 0, true, fmt::format("n_{}", i));
    }
  }

  // ---- path (paper eq. 3) and tier link (eq. 2)
  void add_path_and_tier_links() {
    Expr e0, eL;
    for (int e = 1; e <= L; ++e)
      if (x[0][size_t(e)] >= 0) e0.emplace_back(x[0][size_t(e)], 1);
    for (int s = 0; s < L; ++s)
      if (x[size_t(s)][size_t(L)] >= 0) eL.emplace_back(x[size_t(s)][size_t(L)], 1);
    lp.label = "path";
    lp.row(e0, 1, 1);
    lp.row(eL, 1, 1);
    for (int i = 1; i < L; ++i) {
      Expr in_e = z(i), out_e = z(i);
      for (int s = 0; s < i; ++s)
        if (x[size_t(s)][size_t(i)] >= 0) in_e.emplace_back(x[size_t(s)][size_t(i)], -1);
      for (int e = i + 1; e <= L; ++e)
        if (x[size_t(i)][size_t(e)] >= 0) out_e.emplace_back(x[size_t(i)][size_t(e)], -1);
      lp.label = fmt::format("link z_{}", i);
      lp.row(in_e, 0, 0);
      lp.row(out_e, 0, 0);
    }
  }

  // ---- cumulative transfer fractions
  void add_cumulative_transfers() {
    D.assign(size_t(L + 1), {});
    W = Rd = H = D;
    Dlo.assign(size_t(L + 1), -1);
    Dhi = Wlo = Whi = Rlo = Rhi = Hlo = Hhi = Dlo;
    for (int i = 1; i < L; ++i) {
      if (off(i).empty()) continue;
      add_offload_and_reload_totals(i);
      const bool nv = n[size_t(i)] >= 0;
      if (nv) add_nvme_write_and_read(i);
      add_reload_order_and_deadline(i, nv);
    }
  }

  // Monotone cumulative fractions V[i][a..b], named nm_i_w.
  void add_cumulative(std::vector<std::vector<int>>& V, std::vector<int>& lo, std::vector<int>& hi, int i, int a, int b,
                      const char* nm) {
    lo[size_t(i)] = a;
    hi[size_t(i)] = b;
    V[size_t(i)].assign(size_t(S), -1);
    for (int w = a; w <= b; ++w) V[size_t(i)][size_t(w)] = lp.var(0, 1, 0, false, fmt::format("{}_{}_{}", nm, i, w));
    lp.label = fmt::format("monotone {}_{}", nm, i);
    for (int w = a + 1; w <= b; ++w) lp.row({{V[size_t(i)][size_t(w)], 1}, {V[size_t(i)][size_t(w - 1)], -1}}, 0, kInf);
  }

  // Boundary i's offload D and reload H, each complete by its last slot.
  void add_offload_and_reload_totals(int i) {
    add_cumulative(D, Dlo, Dhi, i, i, L, "D");
    add_cumulative(H, Hlo, Hhi, i, L, 2 * L - i - 1, "H");
    Expr e = {{D[size_t(i)][size_t(L)], 1}};
    add(e, off(i), -1);
    lp.label = fmt::format("totals {}", i);
    lp.row(e, 0, 0);
    Expr h = {{H[size_t(i)][size_t(2 * L - i - 1)], 1}};
    add(h, off(i), -1);
    lp.row(h, 0, 0);
  }

  // Boundary i's NVMe write W (after its offload) and read R (after the write).
  void add_nvme_write_and_read(int i) {
    add_cumulative(W, Wlo, Whi, i, i + 1, L, "W");
    add_cumulative(Rd, Rlo, Rhi, i, i + 2, 2 * L - i - 1, "R");
    lp.row({{W[size_t(i)][size_t(L)], 1}, {n[size_t(i)], -1}}, 0, 0);
    lp.row({{Rd[size_t(i)][size_t(2 * L - i - 1)], 1}, {n[size_t(i)], -1}}, 0, 0);
    lp.label = fmt::format("order nvme {}", i);
    for (int w = i + 1; w <= L; ++w) {  // write after offload
      Expr e = Wc(i, w);
      add(e, Dc(i, w - 1), -1);
      lp.row(e, -kInf, 0);
    }
    // read after write (from slot L+1 on the write is complete: W_{i,L} = n_i >= R)
    for (int w = i + 2; w <= std::min(L, 2 * L - i - 1); ++w) {
      Expr e = Rc(i, w);
      add(e, Wc(i, w - 1), -1);
      lp.row(e, -kInf, 0);
    }
  }

  // Boundary i's reload after its offload (and NVMe read, nv), complete before its backward block needs it.
  void add_reload_order_and_deadline(int i, bool nv) {
    lp.label = fmt::format("reload order/deadline {}", i);
    for (int w = L; w <= 2 * L - i - 1; ++w) {
      if (w == L) {  // reload after offload (from slot L+1 on, D_{i,L} = c_i + n_i bounds H already)
        Expr e = Hc(i, w);
        add(e, Dc(i, w - 1), -1);
        lp.row(e, -kInf, 0);
      }
      if (nv) {  // and after the NVMe read (cpu-tier: bounded by c_i)
        Expr f = Hc(i, w);
        add(f, Rc(i, w - 1), -1);
        if (c[size_t(i)] >= 0) f.emplace_back(c[size_t(i)], -1);
        lp.row(f, -kInf, 0);
      }
      // Deadline: complete before the block starting at i begins (its first slot is 2L-e+1).
      Expr d = Hc(i, w);
      for (int e = i + 1; e <= L && e < 2 * L - w; ++e)
        if (x[size_t(i)][size_t(e)] >= 0) d.emplace_back(x[size_t(i)][size_t(e)], 1);
      add(d, off(i), -1);
      lp.row(d, 0, kInf);
    }
  }

  // ---- inner-boundary counter u_j (boundaries regenerated in the block containing layer j)
  void add_inner_boundary_counters() {
    u.assign(size_t(L), -1);
    for (int j = 1; j < L; ++j) {
      u[size_t(j)] = lp.var(0, j, 0, false, fmt::format("u_{}", j));
      Expr e = {{u[size_t(j)], 1}};
      if (j > 1) e.emplace_back(u[size_t(j - 1)], -1);
      add(e, z(j), double(L));
      lp.label = fmt::format("inner u_{}", j);
      lp.row(e, 1, kInf);
    }
  }

  // ---- slots: traffic, time, memory
  // Slot durations T_w, start times st_w (after the optimizer has finished what the slot reads) and the step's end.
  void add_slot_times_and_chain() {
    T.assign(size_t(S), -1);
    st.assign(size_t(S), -1);
    const auto O = in.opt_done();
    for (int w = 0; w < S; ++w) {
      T[size_t(w)] = lp.var(0, kInf, 0, false, fmt::format("T_{}", w));
      double wait = w < L ? O[size_t(w + 1 <= L - 1 ? w + 1 : L)] : 0;
      if (w == 0) wait = std::max(wait, std::max(O[0], in.device_update_s) + in.step_prologue() + in.prologue());
      st[size_t(w)] = lp.var(wait, kInf, 0, false, fmt::format("st_{}", w));
    }
    end = lp.var(in.opt_last(), kInf, 1.0, false, "end");
    lp.label = "start chain";
    for (int w = 1; w < S; ++w)
      lp.row({{st[size_t(w)], 1}, {st[size_t(w - 1)], -1}, {T[size_t(w - 1)], -1}}, 0, kInf);
    // end >= first micro-batch's end + (m-1) * (prologue + sum of slot times + epilogue)
    const double pro = in.prologue(), epi = in.epilogue();
    const double k = double(in.micro_batches - 1);
    Expr e = {{end, 1}, {st[size_t(S - 1)], -1}, {T[size_t(S - 1)], -1}};
    if (k > 0)
      for (int w = 0; w < S; ++w) e.emplace_back(T[size_t(w)], -k);
    lp.row(e, epi + k * (pro + epi) + in.step_epilogue(), kInf);
  }

  // Slot w's duration bounds each lane's time: compute, host link, device link, both links, NVMe read and write.
  void add_slot_time_lanes(int w) {
    const double A = in.A;
    double Cc = 0, hc = 0, dc = 0;
    Expr Ce, he, de, re, we;
    for (int i = 1; i < L; ++i) {
      if (Dlo[size_t(i)] >= 0) {
        add(de, delta(Dc(i, w), Dc(i, w - 1)), A);
        add(he, delta(Hc(i, w), Hc(i, w - 1)), A);
      }
      if (Wlo[size_t(i)] >= 0) {
        add(we, delta(Wc(i, w), Wc(i, w - 1)), A);
        add(re, delta(Rc(i, w), Rc(i, w - 1)), A);
      }
    }
    if (w < L) {
      Cc = in.rho[size_t(w)];
      hc = in.h_F(w);
    } else if (w == L) {
      Cc = in.head_s;
      hc = in.h_H();
    } else {
      const int j = 2 * L - w;
      Cc = in.beta[size_t(j)];
      hc = in.h_B(j);
      dc = in.d_B(j);
      for (int s = 0; s < j; ++s)
        if (x[size_t(s)][size_t(j + 1)] >= 0) {
          Ce.emplace_back(x[size_t(s)][size_t(j + 1)], in.R(s, j + 1));
          he.emplace_back(x[size_t(s)][size_t(j + 1)], in.R_bytes(s, j + 1));
        }
    }
    const int t = T[size_t(w)];
    auto lane = [&](double bw, const Expr& e1, double k1, const Expr* e2, double k2, double scale) {
      Expr r = {{t, bw}};
      add(r, e1, -1);
      if (e2) add(r, *e2, -1);
      lp.row(r, k1 + k2, kInf, scale);
    };
    lp.label = fmt::format("slot {} time", w);
    lane(1.0, Ce, Cc, nullptr, 0, 1.0);
    lane(in.bh, he, hc, nullptr, 0, 1.0 / A);
    lane(in.bd, de, dc, nullptr, 0, 1.0 / A);
    lane(in.bb, he, hc, &de, dc, 1.0 / A);
    if (!re.empty()) lane(in.bnr, re, 0, nullptr, 0, 1.0 / A);
    if (!we.empty()) lane(in.bnw, we, 0, nullptr, 0, 1.0 / A);
  }

  // HBM during slot w (same accounting as the simulator).
  void add_slot_hbm(int w) {
    const double A = in.A;
    Expr m;
    double mc = in.ring + A;  // boundary 0 is always resident
    if (w < L) {
      const int j = w;
      if (j == 0) mc -= A;  // boundary 0 is the input, counted below
      for (int i = 1; i < j; ++i) {
        add(m, z(i), A);
        add(m, Dc(i, j - 1), -A);
      }
      mc += 2 * A + in.ws_fwd[size_t(j)];
    } else if (w == L) {
      for (int i = 1; i < L; ++i) {
        add(m, z(i), A);
        add(m, Dc(i, L - 1), -A);
        add(m, Hc(i, L), A);
      }
      mc += A + in.ws_head;
    } else {
      const int j = 2 * L - w;
      for (int i = 1; i <= j; ++i) {
        if (g[size_t(i)] >= 0 && i < L) m.emplace_back(g[size_t(i)], A);
        if (i < L) add(m, Hc(i, w), A);
      }
      if (j >= 1) m.emplace_back(u[size_t(j)], A);
      mc += in.ws_bwd[size_t(j)];
    }
    lp.label = fmt::format("hbm slot {}", w);
    lp.row(m, -kInf, in.hbm_room() - mc, 1.0 / A);
  }

  // ---- DRAM and NVMe
  void add_dram_and_nvme() {
    const double A = in.A;
    Expr dr;
    y = -1;
    Expr nv;
    for (int i = 1; i < L; ++i) {
      if (c[size_t(i)] >= 0) dr.emplace_back(c[size_t(i)], A);
      if (n[size_t(i)] >= 0) nv.emplace_back(n[size_t(i)], A);
    }
    if (!nv.empty()) {
      y = lp.var(0, 1, 0, false, "any_nvme");
      for (int i = 1; i < L; ++i)
        if (n[size_t(i)] >= 0) lp.row({{y, 1}, {n[size_t(i)], -1}}, 0, kInf);
      dr.emplace_back(y, 2.0 * in.staging * A);
      lp.row(nv, -kInf, in.nvme_cap, 1.0 / A);
    }
    lp.label = "dram/nvme";
    if (!dr.empty()) lp.row(dr, -kInf, in.dram_cap - in.dram_fixed, 1.0 / A);
  }
};

}  // namespace

namespace {
// The plan written as a point of the model (integers from the path and tiers, cumulative fractions from the
// shares, slot times and starts from the simulator). Problems go to `out`.
std::vector<double> plan_point(const Model& M, const Instance& in, const Plan& p, std::vector<std::string>& out) {
  std::vector<double> v(size_t(M.lp.ncols()), 0.0);
  const int L = in.L, S = in.slots();
  auto ck = plan_checkpoints(p);
  for (size_t k = 0; k + 1 < ck.size(); ++k) {
    int c = M.x[size_t(ck[k])][size_t(ck[k + 1])];
    if (c < 0) out.push_back(fmt::format("edge ({},{}) was pruned", ck[k], ck[k + 1]));
    else v[size_t(c)] = 1;
  }
  for (int i = 1; i < L; ++i) {
    Tier t = p.tier[size_t(i)];
    auto set = [&](int c, bool on, const char* what) {
      if (c >= 0) v[size_t(c)] = on;
      else if (on) out.push_back(fmt::format("boundary {}: no {} variable", i, what));
    };
    set(M.g[size_t(i)], t == Tier::Gpu, "gpu");
    set(M.c[size_t(i)], t == Tier::Cpu, "cpu");
    set(M.n[size_t(i)], t == Tier::Nvme, "nvme");
  }
  auto ws = window_slots(in, p);
  auto fill = [&](const std::vector<std::vector<int>>& V, const std::vector<int>& lo, const std::vector<int>& hi, int i,
                  const std::vector<Share>& sh) {
    if (lo[size_t(i)] < 0) return;
    std::vector<double> cum(size_t(S), 0);
    for (auto& x : sh) cum[size_t(ws[size_t(x.window)])] += x.fraction;
    for (int w = 1; w < S; ++w) cum[size_t(w)] += cum[size_t(w - 1)];
    for (int w = lo[size_t(i)]; w <= hi[size_t(i)]; ++w) v[size_t(V[size_t(i)][size_t(w)])] = cum[size_t(w)];
    if (!sh.empty() && ws[size_t(sh.front().window)] < lo[size_t(i)])
      out.push_back(fmt::format("boundary {}: a share at slot {} before the variable range {}", i, ws[size_t(sh.front().window)], lo[size_t(i)]));
    if (!sh.empty() && ws[size_t(sh.back().window)] > hi[size_t(i)])
      out.push_back(fmt::format("boundary {}: a share at slot {} after the variable range {}", i, ws[size_t(sh.back().window)], hi[size_t(i)]));
  };
  for (auto& t : p.traffic) {
    fill(M.D, M.Dlo, M.Dhi, t.boundary, t.d2h);
    fill(M.H, M.Hlo, M.Hhi, t.boundary, t.h2d);
    fill(M.W, M.Wlo, M.Whi, t.boundary, t.nvme_write);
    fill(M.Rd, M.Rlo, M.Rhi, t.boundary, t.nvme_read);
  }
  int uj = 0;
  for (int j = 1; j < L; ++j) {
    uj = p.tier[size_t(j)] != Tier::None ? 0 : uj + 1;
    v[size_t(M.u[size_t(j)])] = uj;
  }
  auto r = simulate(in, p);
  for (int w = 0; w < S; ++w) {
    v[size_t(M.T[size_t(w)])] = r.slot_time[size_t(w)];
    v[size_t(M.st[size_t(w)])] = r.slot_start[size_t(w)];
  }
  v[size_t(M.end)] = r.pred.step_s;
  if (M.y >= 0)
    for (int i = 1; i < L; ++i) v[size_t(M.y)] = std::max(v[size_t(M.y)], double(p.tier[size_t(i)] == Tier::Nvme));
  return v;
}
}  // namespace

std::vector<std::string> milp_check_plan(const Instance& in, const Plan& p) {
  Model M(in);
  M.build();
  std::vector<std::string> out;
  auto v = plan_point(M, in, p, out);
  for (auto& x : M.lp.violations(v, 1e-7)) out.push_back(x);
  return out;
}

MilpSolution solve_milp(const Instance& in, const MilpOptions& o, const Plan* warm) {
  const double t0 = now_seconds();
  MilpSolution sol;
  if (in.dram_fixed > in.dram_cap) return sol;
  Model M(in);
  M.build();
  sol.columns = M.lp.ncols();
  sol.rows = M.lp.nrows();
  sol.integers = M.lp.nints();
  for (auto& r : M.x)
    for (int v : r) sol.edges += v >= 0;

  OsiClpSolverInterface solver;
  M.lp.load(solver);
  solver.setObjSense(1.0);
  if (const std::string& f = plan_env().milp_mps; !f.empty()) solver.writeMps(f.c_str());  // debugging aid
  CbcModel model(solver);
  if (warm) {
    // The warm plan as a complete incumbent (cheaper than a MIP start, which CBC completes with an
    // extra LP search): it gives CBC its cutoff at once.
    std::vector<std::string> problems;
    auto v = plan_point(M, in, *warm, problems);
    auto viol = M.lp.violations(v, 1e-6);
    if (problems.empty() && viol.empty()) model.setBestSolution(v.data(), int(v.size()), v[size_t(M.end)], false);
    else log_debug("milp: warm start rejected: {}", problems.empty() ? viol.front() : problems.front());
  }
  CbcSolverUsefulData data;
  data.noPrinting_ = !o.verbose;
  CbcMain0(model, data);
  const std::string sec = fmt::format("{}", o.time_limit_s), ratio = fmt::format("{}", o.rel_gap);
  std::vector<const char*> argv = {"lazytrain-plan", "-log", o.verbose ? "1" : "0", "-timeMode", "elapsed", "-sec", sec.c_str(), "-ratio",
                                   ratio.c_str(), "-preprocess", "off"};
  argv.push_back("-solve");
  argv.push_back("-quit");
  CbcMain1(int(argv.size()), argv.data(), model, [](CbcModel*, int) { return 0; }, data);
  sol.solve_s = now_seconds() - t0;
  const double* v = model.bestSolution();
  if (!v) return sol;
  sol.feasible = true;
  sol.objective = model.getObjValue();
  sol.bound = std::min(model.getBestPossibleObjValue(), sol.objective);
  sol.gap = sol.objective > 0 ? (sol.objective - sol.bound) / sol.objective : 0;
  sol.optimal = model.isProvenOptimal() || sol.gap <= o.rel_gap + 1e-9;
  const int L = in.L;
  sol.tier.assign(size_t(L + 1), Tier::None);
  sol.tier[0] = sol.tier[size_t(L)] = Tier::Gpu;
  auto on = [&](int c) { return c >= 0 && v[c] > 0.5; };
  for (int i = 1; i < L; ++i) {
    if (on(M.g[size_t(i)])) sol.tier[size_t(i)] = Tier::Gpu;
    if (on(M.c[size_t(i)])) sol.tier[size_t(i)] = Tier::Cpu;
    if (on(M.n[size_t(i)])) sol.tier[size_t(i)] = Tier::Nvme;
  }
  auto grab = [&](const std::vector<std::vector<int>>& V, const std::vector<int>& lo, const std::vector<int>& hi, int i) {
    std::vector<double> r(size_t(in.slots()), 0);
    if (lo[size_t(i)] < 0) return r;
    for (int w = lo[size_t(i)]; w < in.slots(); ++w) r[size_t(w)] = std::clamp(v[V[size_t(i)][size_t(std::min(w, hi[size_t(i)]))]], 0.0, 1.0);
    return r;
  };
  sol.d2h.resize(size_t(L + 1));
  sol.nvme_write.resize(size_t(L + 1));
  sol.nvme_read.resize(size_t(L + 1));
  sol.h2d.resize(size_t(L + 1));
  for (int i = 1; i < L; ++i) {
    Tier t = sol.tier[size_t(i)];
    if (t != Tier::Cpu && t != Tier::Nvme) continue;
    sol.d2h[size_t(i)] = grab(M.D, M.Dlo, M.Dhi, i);
    sol.h2d[size_t(i)] = grab(M.H, M.Hlo, M.Hhi, i);
    if (t == Tier::Nvme) {
      sol.nvme_write[size_t(i)] = grab(M.W, M.Wlo, M.Whi, i);
      sol.nvme_read[size_t(i)] = grab(M.Rd, M.Rlo, M.Rhi, i);
    }
  }
  return sol;
}

namespace {
// Cumulative fractions -> shares at plan windows. Tiny steps are merged into the next share so the
// ordering rules (cumulative later <= cumulative earlier) survive rounding.
std::vector<Share> to_shares(const std::vector<double>& cum, const std::vector<int32_t>& first_window) {
  std::vector<Share> out;
  double prev = 0;
  for (size_t w = 0; w < cum.size(); ++w) {
    double c = std::min(1.0, cum[w]);
    if (c - prev > 1e-6) {
      out.push_back({first_window[w], c - prev});
      prev = c;
    }
  }
  if (!out.empty()) {
    double sum = 0;
    for (auto& s : out) sum += s.fraction;
    out.back().fraction += 1.0 - sum;  // exact sum 1
  }
  return out;
}
}  // namespace

void apply_milp_solution(const Instance& in, const MilpSolution& s, Plan& p) {
  LT_CHECK(s.feasible, "apply_milp_solution: no solution");
  p.tier = s.tier;
  p.blocks = blocks_from_tiers(p.tier);
  auto first = slot_first_window(in, p);
  p.traffic.clear();
  for (int i = 1; i < in.L; ++i) {
    Tier t = p.tier[size_t(i)];
    if (t != Tier::Cpu && t != Tier::Nvme) continue;
    CheckpointTraffic c;
    c.boundary = i;
    c.d2h = to_shares(s.d2h[size_t(i)], first);
    c.h2d = to_shares(s.h2d[size_t(i)], first);
    if (t == Tier::Nvme) {
      c.nvme_write = to_shares(s.nvme_write[size_t(i)], first);
      c.nvme_read = to_shares(s.nvme_read[size_t(i)], first);
    }
    p.traffic.push_back(std::move(c));
  }
}

}  // namespace lt
