// Gated delta rule, chunked forward (WY/UT-transform form, as HF torch_chunk_gated_delta_rule).
//
// Within a chunk of L rows starting from state S0 (one value head), unrolling the recurrence gives
//   S'_i  = G_i S0 + sum_{j<i} (G_i/G_j) k_j Dl_j^T,          G_i = exp(sum_{m<=i} g_m)
//   Dl_i  = b_i (v_i - S'_i^T k_i)
//         = b_i v_i - b_i G_i S0^T k_i - sum_{j<i} b_i (k_i.k_j) (G_i/G_j) Dl_j
// i.e. (I + A) Dl = diag(b) V - diag(b G) K S0 with A[i,j] = b_i (k_i.k_j) exp(gam_i - gam_j), j < i.
// So Dl = U - W S0 with U = (I+A)^-1 diag(b) V and W = (I+A)^-1 diag(b G) K (both by forward
// substitution, independent of S0), and
//   o_i   = S_i^T q~_i = G_i S0^T q~_i + sum_{j<=i} (q~_i.k_j) exp(gam_i - gam_j) Dl_j
//   S_end = G_{L-1} S0 + sum_j exp(gam_{L-1} - gam_j) k_j Dl_j^T.
// Decay ratios are formed from differences of the double cumulative log-decays (never G_i / G_j).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops_gdn.h"
#include "backend/cpu/ops_gdn_rule_impl.h"
#include "core/error.h"

namespace lt::cpu {

namespace gdn_detail {

void check_shape(const GdnShape& s, const char* what) {
  LT_CHECK(s.S >= 0 && s.Hk > 0 && s.Hv > 0 && s.Dk > 0 && s.Dv > 0 && s.Hv % s.Hk == 0 && s.chunk > 0,
           "{}: bad shape S={} Hk={} Hv={} Dk={} Dv={} chunk={} (Hv must be a multiple of Hk)", what, s.S, s.Hk, s.Hv,
           s.Dk, s.Dv, s.chunk);
}

std::vector<char> segment_start_flags(const int32_t* seg, int64_t S) {
  std::vector<char> f(size_t(std::max<int64_t>(S, 0)), 0);
  for (int64_t t = 0; t < S; ++t) f[size_t(t)] = (t == 0 || (seg && seg[t] != seg[t - 1])) ? 1 : 0;
  return f;
}

std::vector<Chunk> make_chunks(const GdnShape& s, const int32_t* seg) {
  std::vector<Chunk> out;
  const auto start = segment_start_flags(seg, s.S);
  int64_t t = 0;
  while (t < s.S) {
    int64_t end = t + 1;  // end of t's segment
    while (end < s.S && !start[size_t(end)]) ++end;
    for (int64_t t0 = t; t0 < end; t0 += s.chunk) out.push_back({t0, std::min(s.chunk, end - t0), t0 == t});
    t = end;
  }
  return out;
}

ChunkWork::ChunkWork(int64_t chunk, int64_t dk, int64_t dv)
    : C(chunk),
      Dk(dk),
      Dv(dv),
      q(size_t(C * Dk)),
      k(size_t(C * Dk)),
      v(size_t(C * Dv)),
      beta(static_cast<size_t>(C)),
      gam(static_cast<size_t>(C)),
      G(static_cast<size_t>(C)),
      Ge(static_cast<size_t>(C)),
      M(size_t(C * C)),
      KK(size_t(C * C)),
      QK(size_t(C * C)),
      A(size_t(C * C)),
      U(size_t(C * Dv)),
      W(size_t(C * Dk)),
      Dl(size_t(C * Dv)),
      acc(size_t(std::max(Dk, Dv))) {}

void ChunkWork::load(const GdnShape& s, const float* q_in, const float* k_in, const float* v_in, const float* g_in,
                     const float* beta_in, const Chunk& c, int64_t h) {
  L = c.len;
  const int64_t kh = h / (s.Hv / s.Hk);
  const float scale = q_scale(Dk);
  double cum = 0;
  for (int64_t i = 0; i < L; ++i) {
    const int64_t t = c.t0 + i;
    for (int64_t d = 0; d < Dk; ++d) {
      q[size_t(i * Dk + d)] = scale * q_in[(t * s.Hk + kh) * Dk + d];
      k[size_t(i * Dk + d)] = k_in[(t * s.Hk + kh) * Dk + d];
    }
    for (int64_t e = 0; e < Dv; ++e) v[size_t(i * Dv + e)] = v_in[(t * s.Hv + h) * Dv + e];
    beta[size_t(i)] = beta_in[t * s.Hv + h];
    cum += double(g_in[t * s.Hv + h]);
    gam[size_t(i)] = cum;
  }
  for (int64_t i = 0; i < L; ++i) {
    G[size_t(i)] = float(std::exp(gam[size_t(i)]));
    Ge[size_t(i)] = float(std::exp(gam[size_t(L - 1)] - gam[size_t(i)]));
    for (int64_t j = 0; j <= i; ++j) {
      const size_t ij = size_t(i * C + j);
      M[ij] = float(std::exp(gam[size_t(i)] - gam[size_t(j)]));
      KK[ij] = float(dotd(&k[size_t(i * Dk)], &k[size_t(j * Dk)], Dk));
      QK[ij] = float(dotd(&q[size_t(i * Dk)], &k[size_t(j * Dk)], Dk));
      A[ij] = j < i ? float(double(beta[size_t(i)]) * double(KK[ij]) * double(M[ij])) : 0.0f;
    }
  }
  // Forward substitution: X_i = B_i - sum_{j<i} A[i,j] X_j  for X = U (B = b V) and X = W (B = b G K).
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t e = 0; e < Dv; ++e) acc[size_t(e)] = double(beta[size_t(i)]) * double(v[size_t(i * Dv + e)]);
    for (int64_t j = 0; j < i; ++j) axpyd(-double(A[size_t(i * C + j)]), &U[size_t(j * Dv)], acc.data(), Dv);
    to_float(acc.data(), &U[size_t(i * Dv)], Dv);
    const double bg = double(beta[size_t(i)]) * double(G[size_t(i)]);
    for (int64_t d = 0; d < Dk; ++d) acc[size_t(d)] = bg * double(k[size_t(i * Dk + d)]);
    for (int64_t j = 0; j < i; ++j) axpyd(-double(A[size_t(i * C + j)]), &W[size_t(j * Dk)], acc.data(), Dk);
    to_float(acc.data(), &W[size_t(i * Dk)], Dk);
  }
}

void ChunkWork::deltas(const float* S0) {
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t e = 0; e < Dv; ++e) acc[size_t(e)] = double(U[size_t(i * Dv + e)]);
    if (S0)
      for (int64_t d = 0; d < Dk; ++d) axpyd(-double(W[size_t(i * Dk + d)]), S0 + d * Dv, acc.data(), Dv);
    to_float(acc.data(), &Dl[size_t(i * Dv)], Dv);
  }
}

void ChunkWork::advance_state(float* S) {
  const double gl = double(G[size_t(L - 1)]);
  for (int64_t d = 0; d < Dk; ++d) {
    float* Sd = S + d * Dv;
    for (int64_t e = 0; e < Dv; ++e) acc[size_t(e)] = gl * double(Sd[e]);
    for (int64_t j = 0; j < L; ++j)
      axpyd(double(Ge[size_t(j)]) * double(k[size_t(j * Dk + d)]), &Dl[size_t(j * Dv)], acc.data(), Dv);
    to_float(acc.data(), Sd, Dv);
  }
}

void head_chunked_fwd(const GdnShape& s, const float* q, const float* k, const float* v, const float* g,
                      const float* beta, const std::vector<Chunk>& chunks, int64_t h, float* o, float* states,
                      int64_t state_stride) {
  const int64_t Dk = s.Dk, Dv = s.Dv;
  ChunkWork w(s.chunk, Dk, Dv);
  std::vector<float> S(size_t(Dk * Dv), 0.0f);
  std::vector<double> acc(static_cast<size_t>(Dv));
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const Chunk& c = chunks[ci];
    if (c.first) std::fill(S.begin(), S.end(), 0.0f);
    if (states) std::copy(S.begin(), S.end(), states + int64_t(ci) * state_stride);
    w.load(s, q, k, v, g, beta, c, h);
    w.deltas(S.data());
    if (o) {
      for (int64_t i = 0; i < w.L; ++i) {
        // o_i = G_i S0^T q~_i + sum_{j<=i} QK[i,j] M[i,j] Dl_j
        vecmat(&w.q[size_t(i * Dk)], S.data(), Dk, Dv, acc.data());
        for (auto& x : acc) x *= double(w.G[size_t(i)]);
        for (int64_t j = 0; j <= i; ++j) {
          const size_t ij = size_t(i * w.C + j);
          axpyd(double(w.QK[ij]) * double(w.M[ij]), &w.Dl[size_t(j * Dv)], acc.data(), Dv);
        }
        to_float(acc.data(), o + ((c.t0 + i) * s.Hv + h) * Dv, Dv);
      }
    }
    w.advance_state(S.data());
  }
}

}  // namespace gdn_detail

using namespace gdn_detail;

int64_t gdn_rule_num_chunks(const GdnShape& s, const int32_t* seg) {
  check_shape(s, "gdn_rule_num_chunks");
  return int64_t(make_chunks(s, seg).size());
}

void gdn_rule_chunked_fwd(const GdnShape& s, const float* q, const float* k, const float* v, const float* g,
                          const float* beta, const int32_t* seg, float* o, float* chunk_states) {
  check_shape(s, "gdn_rule_chunked_fwd");
  const auto chunks = make_chunks(s, seg);
  const int64_t DD = s.Dk * s.Dv;
  // Value heads are independent: the split over threads does not change any result.
#pragma omp parallel for schedule(static) if (s.S * s.Hv * DD > (1 << 18))
  for (int64_t h = 0; h < s.Hv; ++h)
    head_chunked_fwd(s, q, k, v, g, beta, chunks, h, o, chunk_states ? chunk_states + h * DD : nullptr, s.Hv * DD);
}

}  // namespace lt::cpu
