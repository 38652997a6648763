#include "plan/dp.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/log.h"
#include "core/timer.h"
#include "plan/heuristics.h"

namespace lt {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Tier codes in the state: 0 gpu, 1 cpu, 2 nvme; predecessor code 3 = none (boundary 0).
constexpr int G = 0, C = 1, N = 2, NONE = 3;
inline bool off(int t) { return t == C || t == N; }

struct Extra {
  int slot;
  double C, h, d, r, w;  // full slot content
};

class Dp {
 public:
  Dp(const Instance& in, bool allow_cpu, bool allow_nvme, int cmax, int nmax)
      : in_(in), L_(in.L), allow_cpu_(allow_cpu), allow_nvme_(allow_nvme) {
    // A state's GPU boundaries are resident in the backward slot of its own layer: the smallest layer
    // working set bounds the count.
    const double room = in.hbm_room() - in.ring - *std::min_element(in.ws_bwd.begin(), in.ws_bwd.end());
    gmax_ = std::clamp(int(std::floor(room / in.A)), 0, L_ + 1);
    cdim_ = (!allow_cpu || cmax >= L_ - 1) ? 1 : cmax + 1;
    ndim_ = (!allow_nvme || nmax >= L_ - 1) ? 1 : nmax + 1;
    cmax_ = cmax;
    nmax_ = nmax;
    // Standard slots (mandatory traffic only) and prefix sums.
    fstd_.resize(size_t(L_));
    bstd_.resize(size_t(L_));
    pf_.assign(size_t(L_ + 1), 0);
    pb_.assign(size_t(L_ + 1), 0);
    for (int j = 0; j < L_; ++j) {
      fstd_[size_t(j)] = in.slot_time(in.rho[size_t(j)], in.h_F(j), 0, 0, 0);
      bstd_[size_t(j)] = in.slot_time(in.beta[size_t(j)], in.h_B(j), in.d_B(j), 0, 0);
      pf_[size_t(j + 1)] = pf_[size_t(j)] + fstd_[size_t(j)];
      pb_[size_t(j + 1)] = pb_[size_t(j)] + bstd_[size_t(j)];
    }
    prho_.assign(size_t(L_ + 1), 0);
    pP_.assign(size_t(L_ + 1), 0);
    for (int j = 0; j < L_; ++j) {
      prho_[size_t(j + 1)] = prho_[size_t(j)] + in.rho[size_t(j)];
      pP_[size_t(j + 1)] = pP_[size_t(j)] + in.P[size_t(j)];
    }
    hstd_ = in.slot_time(in.head_s, in.h_H(), 0, 0, 0);
  }

  long long nstates() const { return (long long)(L_ + 1) * 3 * 4 * 2 * 2 * (gmax_ + 1) * cdim_ * ndim_; }

  DpResult run() {
    DpResult res;
    if (gmax_ < 1) return res;
    const long long n = nstates();
    if (n > 60'000'000LL) {
      log_warn("dp: {} states is too many; skipping this variant", n);
      return res;
    }
    cost_.assign(size_t(n), kInf);
    parent_.assign(size_t(n), -1);
    cost_[size_t(idx(0, G, NONE, 0, 0, 1, 0, 0))] = 0;
    double best = kInf;
    long long best_state = -1;
    for (int i = 0; i < L_; ++i)
      for (int ti = 0; ti < 3; ++ti)
        for (int tp = 0; tp < 4; ++tp)
          for (int adj = 0; adj < 2; ++adj)
            for (int rp = 0; rp < 2; ++rp)
              for (int g = 0; g <= gmax_; ++g)
                for (int c = 0; c < cdim_; ++c)
                  for (int nn = 0; nn < ndim_; ++nn) {
                    const long long s = idx(i, ti, tp, adj, rp, g, c, nn);
                    const double base = cost_[size_t(s)];
                    if (base == kInf) continue;
                    // HBM of the block (i,e) beyond the ring: its backward slots B_j hold the resident
                    // boundaries, j-i regenerated ones and layer j's working set (B_i also the reload of
                    // pred(i)); its forward slots F_j hold the GPU boundaries < j, in/out and layer j's
                    // workspace. Layer i's slots do not depend on e; a larger e adds layer e-1's, so
                    // stop at the first e that does not fit.
                    const double room = in_.hbm_room() - in_.ring;
                    const double resident = in_.A * double(g + off(ti));
                    if (resident + in_.A * double(off(tp)) + in_.ws_bwd[size_t(i)] > room) continue;
                    if (in_.A * double(g - (ti == G) + 2) + in_.ws_fwd[size_t(i)] > room) continue;
                    for (int e = i + 1; e <= L_; ++e) {
                      const size_t last = size_t(e - 1);
                      if (e - 1 > i && (resident + in_.A * double(e - 1 - i) + in_.ws_bwd[last] > room ||
                                        in_.A * double(g + 2) + in_.ws_fwd[last] > room))
                        break;
                      if (ti == N && !tied_nvme_ok(L_, i, e)) continue;
                      double t = base + trans_cost(i, ti, tp, adj, rp, e);
                      if (e == L_) {
                        if (in_.A * double(g + off(ti)) + in_.A + in_.ws_head > room) continue;
                        if (t < best) {
                          best = t;
                          best_state = s;
                        }
                        continue;
                      }
                      for (int te = 0; te < 3; ++te) {
                        if (te == C && !allow_cpu_) continue;
                        if (te == N && !allow_nvme_) continue;
                        const int g2 = g + (te == G), c2 = c + (te == C && cdim_ > 1), n2 = nn + (te == N && ndim_ > 1);
                        if (g2 > gmax_ || c2 >= cdim_ || n2 >= ndim_) continue;
                        const int adj2 = e == i + 1, rp2 = adj2 && tp == N;
                        const long long s2 = idx(e, te, ti, adj2, rp2, g2, c2, n2);
                        if (t < cost_[size_t(s2)]) {
                          cost_[size_t(s2)] = t;
                          parent_[size_t(s2)] = s;
                        }
                      }
                    }
                  }
    if (best_state < 0) return res;
    res.feasible = true;
    res.value = double(in_.micro_batches) * (best + in_.prologue() + in_.epilogue()) + in_.step_prologue() +
                in_.step_epilogue() + in_.device_update_s;
    res.tier.assign(size_t(L_ + 1), Tier::None);
    res.tier[size_t(L_)] = Tier::Gpu;
    for (long long s = best_state; s >= 0; s = parent_[size_t(s)]) {
      int i, ti;
      decode(s, i, ti);
      res.tier[size_t(i)] = ti == G ? Tier::Gpu : ti == C ? Tier::Cpu : Tier::Nvme;
    }
    return res;
  }

 private:
  long long idx(int i, int ti, int tp, int adj, int rp, int g, int c, int n) const {
    long long k = i;
    k = k * 3 + ti;
    k = k * 4 + tp;
    k = k * 2 + adj;
    k = k * 2 + rp;
    k = k * (gmax_ + 1) + g;
    k = k * cdim_ + c;
    k = k * ndim_ + n;
    return k;
  }
  void decode(long long k, int& i, int& ti) const {
    k /= ndim_;
    k /= cdim_;
    k /= (gmax_ + 1);
    k /= 2;
    k /= 2;
    k /= 4;
    ti = int(k % 3);
    i = int(k / 3);
  }

  // Slot times of F_i..F_{e-1}, B_{e-1}..B_i (and H when e = L) for the block (i,e).
  double trans_cost(int i, int ti, int tp, int adj, int rp, int e) const {
    const double A = in_.A;
    double sum = pf_[size_t(e)] - pf_[size_t(i)] + pb_[size_t(e)] - pb_[size_t(i)];
    Extra ex[8];
    int n = 0;
    auto get = [&](int slot) -> Extra& {
      for (int k = 0; k < n; ++k)
        if (ex[k].slot == slot) return ex[k];
      Extra& x = ex[n++];
      x.slot = slot;
      if (slot < L_) {
        x = {slot, in_.rho[size_t(slot)], in_.h_F(slot), 0, 0, 0};
      } else if (slot == L_) {
        x = {slot, in_.head_s, in_.h_H(), 0, 0, 0};
      } else {
        const int j = 2 * L_ - slot;
        x = {slot, in_.beta[size_t(j)], in_.h_B(j), in_.d_B(j), 0, 0};
      }
      return x;
    };
    if (off(ti)) get(i).d += A;
    if (adj && tp == N) get(i).w += A;
    if (ti == N && i + 1 <= e - 1) get(i + 1).w += A;
    if (e == L_ && ti == N) get(L_ - 1).r += A;
    if (e - i >= 2) {
      Extra& r = get(2 * L_ - (e - 1));
      r.C += prho_[size_t(e - 1)] - prho_[size_t(i)];
      r.h += pP_[size_t(e - 1)] - pP_[size_t(i)];
      if (tp == N) get(2 * L_ - (i + 1)).r += A;
    }
    {
      Extra& b = get(2 * L_ - i);
      if (off(tp)) b.h += A;
      if (rp) b.r += A;
    }
    if (e == L_) {
      Extra& h = get(L_);
      if (off(ti)) h.h += A;
      if (i == L_ - 1 && tp == N) h.r += A;
      sum += hstd_;  // H standard, replaced below
    }
    for (int k = 0; k < n; ++k) {
      const Extra& x = ex[k];
      double std_t;
      if (x.slot < L_) std_t = fstd_[size_t(x.slot)];
      else if (x.slot == L_) std_t = hstd_;
      else std_t = bstd_[size_t(2 * L_ - x.slot)];
      sum += in_.slot_time(x.C, x.h, x.d, x.r, x.w) - std_t;
    }
    return sum;
  }

  const Instance& in_;
  int L_;
  bool allow_cpu_, allow_nvme_;
  int gmax_ = 0, cdim_ = 1, ndim_ = 1, cmax_ = 0, nmax_ = 0;
  std::vector<double> fstd_, bstd_, pf_, pb_, prho_, pP_;
  double hstd_ = 0;
  std::vector<double> cost_;
  std::vector<long long> parent_;
};

}  // namespace

DpResult solve_dp(const Instance& in) {
  const double t0 = now_seconds();
  DpResult best;
  const double room = in.dram_cap - in.dram_fixed;
  for (int variant = 0; variant < 2; ++variant) {
    const bool nv = variant == 1;
    if (nv && !in.allow_nvme) continue;
    const double cpu_room = room - (nv ? 2.0 * in.staging * in.A : 0.0);
    const int cmax = cpu_room < 0 ? -1 : int(std::min(1e9, std::floor(cpu_room / in.A)));
    if (cmax < 0) continue;  // the model state alone (plus staging) does not fit
    const int nmax = int(std::min(1e9, std::floor(in.nvme_cap / in.A)));
    if (nv && nmax < 1) continue;
    Dp dp(in, cmax >= 1, nv, cmax, nmax);
    auto r = dp.run();
    r.states += dp.nstates();
    if (r.feasible && (!best.feasible || r.value < best.value - 1e-12)) best = r;
    best.states = std::max(best.states, r.states);
  }
  best.solve_s = now_seconds() - t0;
  return best;
}

}  // namespace lt
