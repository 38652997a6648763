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
#include <immintrin.h>

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

// ---------------------------------------------------------------- fp32 row kernels

namespace {

alignas(32) constexpr int32_t kMaskBits[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
inline __m256i tail_mask(int64_t cols) {  // the first cols (1..8) lanes
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMaskBits + 8 - cols));
}

// R rows x V vectors of 8 columns of Y; the last vector masked when MASK.
template <int R, int V, bool NEG, bool MASK>
inline void micro(float* Y, int64_t ldy, const float* A, int64_t lda, int64_t as, const float* B, int64_t ldb,
                  int64_t k, bool accumulate, __m256i mask) {
  __m256 c[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      float* y = Y + r * ldy + 8 * v;
      c[r][v] = !accumulate ? _mm256_setzero_ps()
                : (MASK && v == V - 1) ? _mm256_maskload_ps(y, mask)
                                       : _mm256_loadu_ps(y);
    }
  for (int64_t p = 0; p < k; ++p) {
    const float* b = B + p * ldb;
    __m256 bv[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) bv[v] = (MASK && v == V - 1) ? _mm256_maskload_ps(b + 8 * v, mask) : _mm256_loadu_ps(b + 8 * v);
    const float* a = A + p * as;
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) c[r][v] = NEG ? _mm256_fnmadd_ps(av, bv[v], c[r][v]) : _mm256_fmadd_ps(av, bv[v], c[r][v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      float* y = Y + r * ldy + 8 * v;
      if (MASK && v == V - 1)
        _mm256_maskstore_ps(y, mask, c[r][v]);
      else
        _mm256_storeu_ps(y, c[r][v]);
    }
}

template <int R, bool NEG>
void block_rows(float* Y, int64_t ldy, int64_t n, const float* A, int64_t lda, int64_t as, const float* B,
                int64_t ldb, int64_t k, bool accumulate) {
  int64_t e = 0;
  const __m256i none = _mm256_setzero_si256();
  for (; e + 16 <= n; e += 16) micro<R, 2, NEG, false>(Y + e, ldy, A, lda, as, B + e, ldb, k, accumulate, none);
  const int64_t rem = n - e;
  if (rem > 8)
    micro<R, 2, NEG, true>(Y + e, ldy, A, lda, as, B + e, ldb, k, accumulate, tail_mask(rem - 8));
  else if (rem == 8)
    micro<R, 1, NEG, false>(Y + e, ldy, A, lda, as, B + e, ldb, k, accumulate, none);
  else if (rem > 0)
    micro<R, 1, NEG, true>(Y + e, ldy, A, lda, as, B + e, ldb, k, accumulate, tail_mask(rem));
}

}  // namespace

// Mi[j] = exp(gi - gam[j]) for j < n (the difference in double, the exp in fp32 on 8 lanes).
static void decay_row(double gi, const double* gam, int64_t n, float* Mi) {
  const __m256d g = _mm256_set1_pd(gi);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m128 a = _mm256_cvtpd_ps(_mm256_sub_pd(g, _mm256_loadu_pd(gam + j)));
    const __m128 b = _mm256_cvtpd_ps(_mm256_sub_pd(g, _mm256_loadu_pd(gam + j + 4)));
    _mm256_storeu_ps(Mi + j, exp8(_mm256_set_m128(b, a)));
  }
  if (j < n) {  // the same lane operations on the tail
    alignas(32) float x[8] = {0, 0, 0, 0, 0, 0, 0, 0}, y[8];
    for (int64_t t = j; t < n; ++t) x[t - j] = float(gi - gam[t]);
    _mm256_store_ps(y, exp8(_mm256_load_ps(x)));
    for (int64_t t = j; t < n; ++t) Mi[t] = y[t - j];
  }
}

template <bool NEG>
void gemm_rows(float* Y, int64_t ldy, int64_t m, int64_t n, const float* A, int64_t lda, int64_t as, const float* B,
               int64_t ldb, int64_t k, bool accumulate) {
  if (n <= 0) return;
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) block_rows<4, NEG>(Y + r * ldy, ldy, n, A + r * lda, lda, as, B, ldb, k, accumulate);
  switch (m - r) {
    case 3: block_rows<3, NEG>(Y + r * ldy, ldy, n, A + r * lda, lda, as, B, ldb, k, accumulate); break;
    case 2: block_rows<2, NEG>(Y + r * ldy, ldy, n, A + r * lda, lda, as, B, ldb, k, accumulate); break;
    case 1: block_rows<1, NEG>(Y + r * ldy, ldy, n, A + r * lda, lda, as, B, ldb, k, accumulate); break;
    default: break;
  }
}
template void gemm_rows<false>(float*, int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*,
                               int64_t, int64_t, bool);
template void gemm_rows<true>(float*, int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*,
                              int64_t, int64_t, bool);

void axpyf(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(alpha, x[i], y[i]);
}

void transpose(const float* src, int64_t rows, int64_t cols, int64_t lds, float* dst, int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

// ---------------------------------------------------------------- chunk quantities

ChunkWork::ChunkWork(int64_t chunk, int64_t dk, int64_t dv)
    : C(chunk),
      Dk(dk),
      Dv(dv),
      q(size_t(C * Dk)),
      k(size_t(C * Dk)),
      v(size_t(C * Dv)),
      beta(static_cast<size_t>(C)),
      kT(size_t(Dk * C)),
      gam(static_cast<size_t>(C)),
      G(static_cast<size_t>(C)),
      Ge(static_cast<size_t>(C)),
      M(size_t(C * C)),
      KK(size_t(C * C)),
      P(size_t(C * C)),
      nA(size_t(C * C)),
      U(size_t(C * Dv)),
      W(size_t(C * Dk)),
      Dl(size_t(C * Dv)),
      qG(size_t(C * Dk)),
      kGe(size_t(C * Dk)) {}

void ChunkWork::load(const GdnShape& s, const float* q_in, const float* k_in, const float* v_in, const float* g_in,
                     const float* beta_in, const Chunk& c, int64_t h) {
  L = c.len;
  zero_s0 = c.first;
  const int64_t kh = h / (s.Hv / s.Hk);
  const float scale = q_scale(Dk);
  double cum = 0;
  for (int64_t i = 0; i < L; ++i) {
    const int64_t t = c.t0 + i;
    const float* qr = q_in + (t * s.Hk + kh) * Dk;
    for (int64_t d = 0; d < Dk; ++d) q[size_t(i * Dk + d)] = scale * qr[d];
    std::copy_n(k_in + (t * s.Hk + kh) * Dk, Dk, &k[size_t(i * Dk)]);
    std::copy_n(v_in + (t * s.Hv + h) * Dv, Dv, &v[size_t(i * Dv)]);
    beta[size_t(i)] = beta_in[t * s.Hv + h];
    cum += double(g_in[t * s.Hv + h]);
    gam[size_t(i)] = cum;
  }
  transpose(k.data(), L, Dk, Dk, kT.data(), C);
  for (int64_t i = 0; i < L; ++i) {
    const double gi = gam[size_t(i)];
    G[size_t(i)] = float(std::exp(gi));
    Ge[size_t(i)] = float(std::exp(gam[size_t(L - 1)] - gi));
    float* Mi = &M[size_t(i * C)];
    decay_row(gi, gam.data(), i + 1, Mi);
    for (int64_t j = i + 1; j < L; ++j) Mi[j] = 0.0f;
    for (int64_t d = 0; d < Dk; ++d) {
      qG[size_t(i * Dk + d)] = G[size_t(i)] * q[size_t(i * Dk + d)];
      kGe[size_t(i * Dk + d)] = Ge[size_t(i)] * k[size_t(i * Dk + d)];
    }
  }
  // KK and QK by row blocks (the block's columns up to its last row), then KK M, nA = -b KK M and P = QK M
  // with zeros above the triangles.
  for (int64_t i0 = 0; i0 < L; i0 += kRowBlock) {
    const int64_t m = std::min(kRowBlock, L - i0);
    gemm_rows(&KK[size_t(i0 * C)], C, m, i0 + m, &k[size_t(i0 * Dk)], Dk, 1, kT.data(), C, Dk, false);
    gemm_rows(&P[size_t(i0 * C)], C, m, i0 + m, &q[size_t(i0 * Dk)], Dk, 1, kT.data(), C, Dk, false);
  }
  for (int64_t i = 0; i < L; ++i) {
    const float* Mi = &M[size_t(i * C)];
    float* KMi = &KK[size_t(i * C)];
    float* nAi = &nA[size_t(i * C)];
    float* Pi = &P[size_t(i * C)];
    const float nb = -beta[size_t(i)];
    for (int64_t j = 0; j < i; ++j) {
      KMi[j] *= Mi[j];
      nAi[j] = nb * KMi[j];
      Pi[j] *= Mi[j];
    }
    Pi[i] *= Mi[i];
    for (int64_t j = i; j < L; ++j) KMi[j] = nAi[j] = 0.0f;
    for (int64_t j = i + 1; j < L; ++j) Pi[j] = 0.0f;
  }
  // Forward substitution by row blocks: X_i = B_i - sum_{j<i} A[i,j] X_j for X = U (B = b V) and
  // X = W (B = b G K): the rows before the block in one product, then the block's own rows in order.
  for (int64_t i = 0; i < L; ++i) {
    const float bi = beta[size_t(i)];
    for (int64_t e = 0; e < Dv; ++e) U[size_t(i * Dv + e)] = bi * v[size_t(i * Dv + e)];
    if (!zero_s0)
      for (int64_t d = 0; d < Dk; ++d) W[size_t(i * Dk + d)] = (bi * G[size_t(i)]) * k[size_t(i * Dk + d)];
  }
  for (int64_t i0 = 0; i0 < L; i0 += kRowBlock) {
    const int64_t m = std::min(kRowBlock, L - i0);
    gemm_rows(&U[size_t(i0 * Dv)], Dv, m, Dv, &nA[size_t(i0 * C)], C, 1, U.data(), Dv, i0, true);
    if (!zero_s0) gemm_rows(&W[size_t(i0 * Dk)], Dk, m, Dk, &nA[size_t(i0 * C)], C, 1, W.data(), Dk, i0, true);
    for (int64_t i = i0 + 1; i < i0 + m; ++i) {
      gemm_rows(&U[size_t(i * Dv)], Dv, 1, Dv, &nA[size_t(i * C + i0)], C, 1, &U[size_t(i0 * Dv)], Dv, i - i0, true);
      if (!zero_s0)
        gemm_rows(&W[size_t(i * Dk)], Dk, 1, Dk, &nA[size_t(i * C + i0)], C, 1, &W[size_t(i0 * Dk)], Dk, i - i0,
                  true);
    }
  }
}

void ChunkWork::deltas(const float* S0) {
  std::copy_n(U.data(), L * Dv, Dl.data());
  if (!zero_s0) gemm_rows<true>(Dl.data(), Dv, L, Dv, W.data(), Dk, 1, S0, Dv, Dk, true);
}

void ChunkWork::advance_state(float* S) {
  const float gl = G[size_t(L - 1)];
  if (!zero_s0)
    for (int64_t i = 0; i < Dk * Dv; ++i) S[i] *= gl;
  // S[d, :] += sum_j Ge_j k[j, d] Dl_j
  gemm_rows(S, Dv, Dk, Dv, kGe.data(), 1, Dk, Dl.data(), Dv, L, !zero_s0);
}

namespace {
// Per-thread scratch of the forward (reused across calls).
struct FwdScratch {
  ChunkWork w{0, 0, 0};
  std::vector<float> S;
  ChunkWork& get(const GdnShape& s) {
    if (!w.fits(s.chunk, s.Dk, s.Dv)) w = ChunkWork(s.chunk, s.Dk, s.Dv);
    S.resize(size_t(s.Dk * s.Dv));
    return w;
  }
};
}  // namespace

void head_chunked_fwd(const GdnShape& s, const float* q, const float* k, const float* v, const float* g,
                      const float* beta, const std::vector<Chunk>& chunks, int64_t h, float* o, float* states,
                      int64_t state_stride) {
  const int64_t Dk = s.Dk, Dv = s.Dv, DD = Dk * Dv, n = int64_t(chunks.size());
  const FlushDenormals ftz;
  thread_local FwdScratch scratch;
  ChunkWork& w = scratch.get(s);
  float* S = scratch.S.data();
  for (int64_t ci = 0; ci < n; ++ci) {
    const Chunk& c = chunks[size_t(ci)];
    if (c.first) std::fill_n(S, DD, 0.0f);
    if (states) std::copy_n(S, DD, states + ci * state_stride);
    const bool next = ci + 1 < n && !chunks[size_t(ci + 1)].first;  // S_end is needed
    if (!o && !next) continue;
    w.load(s, q, k, v, g, beta, c, h);
    w.deltas(S);
    if (o) {
      // o_i = G_i S0^T q~_i + sum_{j<=i} P[i,j] Dl_j   (rows of head h in o: stride Hv Dv)
      const int64_t ldo = s.Hv * Dv;
      float* o0 = o + (c.t0 * s.Hv + h) * Dv;
      if (!w.zero_s0) gemm_rows(o0, ldo, w.L, Dv, w.qG.data(), Dk, 1, S, Dv, Dk, false);
      for (int64_t i0 = 0; i0 < w.L; i0 += kRowBlock) {
        const int64_t m = std::min(kRowBlock, w.L - i0);
        gemm_rows(o0 + i0 * ldo, ldo, m, Dv, &w.P[size_t(i0 * w.C)], w.C, 1, w.Dl.data(), Dv, i0 + m, !w.zero_s0);
      }
    }
    if (next) w.advance_state(S);
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
