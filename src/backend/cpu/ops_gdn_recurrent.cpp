// Gated delta rule, token by token: the decode step, the naive forward (test oracle) and BPTT through it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops_gdn.h"
#include "backend/cpu/ops_gdn_rule_impl.h"

namespace lt::cpu {

using namespace gdn_detail;

namespace {

// One token of one value head on its state St [Dk, Dv]; qs is the scaled query.
//   St <- exp(g) St;  delta = b (v - St^T k);  St <- St + k delta^T;  o = St^T qs.
// acc: [max(Dk, Dv)] doubles, delta: [Dv] floats (scratch).
void head_step(const float* qs, const float* k, const float* v, float g, float b, int64_t Dk, int64_t Dv, float* St,
               float* o, double* acc, float* delta) {
  const float a = std::exp(g);
  for (int64_t i = 0; i < Dk * Dv; ++i) St[i] *= a;
  vecmat(k, St, Dk, Dv, acc);
  for (int64_t c = 0; c < Dv; ++c) delta[c] = b * (v[c] - float(acc[c]));
  for (int64_t d = 0; d < Dk; ++d)
    for (int64_t c = 0; c < Dv; ++c) St[d * Dv + c] += k[d] * delta[c];
  vecmat(qs, St, Dk, Dv, acc);
  to_float(acc, o, Dv);
}

}  // namespace

void gdn_rule_step(const float* q_t, const float* k_t, const float* v_t, const float* g_t, const float* beta_t,
                   int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, float* state, float* o_t) {
  check_shape(GdnShape{1, Hk, Hv, Dk, Dv, 1}, "gdn_rule_step");
  const int64_t group = Hv / Hk;
  const float scale = q_scale(Dk);
  std::vector<double> acc(size_t(std::max(Dk, Dv)));
  std::vector<float> qs(static_cast<size_t>(Dk)), delta(static_cast<size_t>(Dv));
  for (int64_t h = 0; h < Hv; ++h) {
    const int64_t kh = h / group;
    for (int64_t d = 0; d < Dk; ++d) qs[size_t(d)] = scale * q_t[kh * Dk + d];
    head_step(qs.data(), k_t + kh * Dk, v_t + h * Dv, g_t[h], beta_t[h], Dk, Dv, state + h * Dk * Dv, o_t + h * Dv,
              acc.data(), delta.data());
  }
}

void gdn_rule_recurrent_fwd(const GdnShape& s, const float* q, const float* k, const float* v, const float* g,
                            const float* beta, const int32_t* seg, float* o) {
  check_shape(s, "gdn_rule_recurrent_fwd");
  const auto start = segment_start_flags(seg, s.S);
  std::vector<float> state(size_t(s.Hv * s.Dk * s.Dv));
  for (int64_t t = 0; t < s.S; ++t) {
    if (start[size_t(t)]) std::fill(state.begin(), state.end(), 0.0f);
    gdn_rule_step(q + t * s.Hk * s.Dk, k + t * s.Hk * s.Dk, v + t * s.Hv * s.Dv, g + t * s.Hv, beta + t * s.Hv, s.Hk,
                  s.Hv, s.Dk, s.Dv, state.data(), o + t * s.Hv * s.Dv);
  }
}

// BPTT per value head. Forward stores S_t for every t. Backward over t, with dS = dL/dS_t from the future
// (zero after the last row of a segment), Sp = exp(g_t) S_{t-1} (S_{t-1} = 0 at a segment start),
// u = Sp^T k, delta = b (v - u):
//   o_t = S_t^T qs          : dS += qs do^T;            dqs = S_t do
//   S_t = Sp + k delta^T    : ddelta = dS^T k;          dk = dS delta;   dSp = dS
//   delta = b (v - u)       : dbeta = ddelta.(v - u);  dv = b ddelta;   du = -b ddelta
//   u = Sp^T k              : dSp += k du^T;            dk += Sp du
//   Sp = exp(g) S_{t-1}     : dg = exp(g) <dSp, S_{t-1}>;  dS_{t-1} = exp(g) dSp
void gdn_rule_recurrent_bwd(const GdnShape& s, const float* q, const float* k, const float* v, const float* g,
                            const float* beta, const int32_t* seg, const float* dout, float* dq, float* dk, float* dv,
                            float* dg, float* dbeta) {
  check_shape(s, "gdn_rule_recurrent_bwd");
  const int64_t S = s.S, Hk = s.Hk, Hv = s.Hv, Dk = s.Dk, Dv = s.Dv, DD = Dk * Dv, group = Hv / Hk;
  const float scale = q_scale(Dk);
  const auto start = segment_start_flags(seg, S);
  std::fill(dq, dq + S * Hk * Dk, 0.0f);
  std::fill(dk, dk + S * Hk * Dk, 0.0f);
  std::vector<float> states(size_t(S * DD)), dS(static_cast<size_t>(DD)), qs(static_cast<size_t>(Dk)), delta(static_cast<size_t>(Dv)), o(static_cast<size_t>(Dv)),
      du(static_cast<size_t>(Dv));
  std::vector<double> acc(size_t(std::max(Dk, Dv))), dk1(static_cast<size_t>(Dk));
  for (int64_t h = 0; h < Hv; ++h) {
    const int64_t kh = h / group;
    auto qrow = [&](int64_t t) {
      for (int64_t d = 0; d < Dk; ++d) qs[size_t(d)] = scale * q[(t * Hk + kh) * Dk + d];
    };
    for (int64_t t = 0; t < S; ++t) {  // forward, keeping every state
      float* St = states.data() + t * DD;
      if (start[size_t(t)])
        std::fill(St, St + DD, 0.0f);
      else
        std::copy(St - DD, St, St);
      qrow(t);
      head_step(qs.data(), k + (t * Hk + kh) * Dk, v + (t * Hv + h) * Dv, g[t * Hv + h], beta[t * Hv + h], Dk, Dv,
                St, o.data(), acc.data(), delta.data());
    }
    std::fill(dS.begin(), dS.end(), 0.0f);
    for (int64_t t = S - 1; t >= 0; --t) {
      const float* St = states.data() + t * DD;
      const float* Sprev = start[size_t(t)] ? nullptr : St - DD;
      const float* kt = k + (t * Hk + kh) * Dk;
      const float* vt = v + (t * Hv + h) * Dv;
      const float* dot = dout + (t * Hv + h) * Dv;
      const float a = std::exp(g[t * Hv + h]), b = beta[t * Hv + h];
      qrow(t);
      // u = Sp^T k = a Sprev^T k; delta = b (v - u)  (u kept in du for now)
      if (Sprev) {
        vecmat(kt, Sprev, Dk, Dv, acc.data());
        for (int64_t c = 0; c < Dv; ++c) du[size_t(c)] = a * float(acc[size_t(c)]);
      } else {
        std::fill(du.begin(), du.end(), 0.0f);
      }
      for (int64_t c = 0; c < Dv; ++c) delta[size_t(c)] = b * (vt[c] - du[size_t(c)]);
      // o_t
      for (int64_t d = 0; d < Dk; ++d)
        for (int64_t c = 0; c < Dv; ++c) dS[size_t(d * Dv + c)] += qs[size_t(d)] * dot[c];
      matvec(St, dot, Dk, Dv, acc.data());
      for (int64_t d = 0; d < Dk; ++d) dq[(t * Hk + kh) * Dk + d] += scale * float(acc[size_t(d)]);
      // S_t = Sp + k delta^T
      matvec(dS.data(), delta.data(), Dk, Dv, dk1.data());
      vecmat(kt, dS.data(), Dk, Dv, acc.data());  // ddelta
      double db = 0;
      for (int64_t c = 0; c < Dv; ++c) {
        const float dd = float(acc[size_t(c)]);
        db += double(dd) * double(vt[c] - du[size_t(c)]);
        dv[(t * Hv + h) * Dv + c] = b * dd;
        du[size_t(c)] = -b * dd;
      }
      dbeta[t * Hv + h] = float(db);
      // u = Sp^T k
      for (int64_t d = 0; d < Dk; ++d)
        for (int64_t c = 0; c < Dv; ++c) dS[size_t(d * Dv + c)] += kt[d] * du[size_t(c)];
      if (Sprev) {
        matvec(Sprev, du.data(), Dk, Dv, acc.data());
        for (int64_t d = 0; d < Dk; ++d) dk1[size_t(d)] += double(a) * acc[size_t(d)];
      }
      for (int64_t d = 0; d < Dk; ++d) dk[(t * Hk + kh) * Dk + d] += float(dk1[size_t(d)]);
      // Sp = a S_{t-1}
      if (Sprev) {
        dg[t * Hv + h] = float(double(a) * dotd(dS.data(), Sprev, DD));
        for (auto& x : dS) x *= a;
      } else {
        dg[t * Hv + h] = 0.0f;
        std::fill(dS.begin(), dS.end(), 0.0f);
      }
    }
  }
}

}  // namespace lt::cpu
