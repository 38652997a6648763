// Causal grouped-query attention for one sequence, with an optional segment mask (packed sequences).
// Blocks of query rows per head: O(block * S) scratch, never an [S,S] matrix for all heads.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/scratch.h"
#include "core/error.h"

namespace lt::cpu {

namespace {

constexpr int64_t kParallelWork = 1 << 16;  // below this, thread start-up costs more than it saves

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

inline bool visible(const int32_t* seg, int64_t i, int64_t j) { return !seg || seg[i] == seg[j]; }

void check_shape(const AttnShape& s) {
  LT_CHECK(s.seq >= 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0 && s.heads % s.kv_heads == 0,
           "attention: bad shape seq={} heads={} kv_heads={} head_dim={} (heads must be a multiple of kv_heads)",
           s.seq, s.heads, s.kv_heads, s.head_dim);
}

}  // namespace

namespace {

// Query rows per block: the scratch is [kQueryBlock, S] scores (+ as much for dP in backward).
constexpr int64_t kQueryBlock = 256;

// For rows i0..i1 of one head, sc [n, i1] holds scaled scores. Replaces them with probabilities
// exp(score - lse_i) (masked and future entries exactly 0). If lse_in == nullptr the row statistics are
// computed here and written to lse_out; otherwise lse_in is used (backward recompute).
void block_probs(float* sc, int64_t i0, int64_t i1, const int32_t* seg, const float* lse_in, float* lse_out) {
  const int64_t n = i1 - i0, ld = i1;
#pragma omp parallel for schedule(static) if (n * i1 > kParallelWork)
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = i0 + r;
    float* row = sc + r * ld;
    for (int64_t j = 0; j <= i; ++j)
      if (!visible(seg, i, j)) row[j] = -std::numeric_limits<float>::infinity();
    float l;
    if (lse_in) {
      l = lse_in[i];
    } else {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= i; ++j) m = std::max(m, row[j]);
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += double(std::exp(row[j] - m));  // exp(-inf) = 0
      l = m + float(std::log(sum));
      lse_out[i] = l;
    }
    for (int64_t j = 0; j <= i; ++j) row[j] = std::exp(row[j] - l);
    for (int64_t j = i + 1; j < ld; ++j) row[j] = 0.0f;
  }
}

}  // namespace

// Per head and block of query rows, scores and the weighted sum of V are GEMMs (OpenBLAS, called from
// this thread), the softmax is an OpenMP loop over rows. Causal: block rows i0..i1 only need keys < i1.
void attention_fwd(const AttnShape& s, const float* q, const float* k, const float* v, const int32_t* seg, float* out,
                   float* lse) {
  check_shape(s);
  const int64_t S = s.seq, H = s.heads, D = s.head_dim, group = s.heads / s.kv_heads;
  const int64_t q_ld = H * D, kv_ld = s.kv_heads * D;
  const int64_t bq = std::min(kQueryBlock, std::max<int64_t>(S, 1));
  Scratch& arena = Scratch::get(1);
  arena.reset(bq * S + S, 2);
  float* sc = arena.take(bq * S);
  float* lse_tmp = arena.take(S);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / group;
    float* lse_h = lse ? lse + h * S : lse_tmp;
    for (int64_t i0 = 0; i0 < S; i0 += bq) {
      const int64_t i1 = std::min(S, i0 + bq), n = i1 - i0;
      sgemm(false, true, n, i1, D, s.scale, q + i0 * q_ld + h * D, q_ld, k + g * D, kv_ld, 0.0f, sc, i1);
      block_probs(sc, i0, i1, seg, nullptr, lse_h);
      sgemm(false, false, n, D, i1, 1.0f, sc, i1, v + g * D, kv_ld, 0.0f, out + i0 * q_ld + h * D, q_ld);
    }
  }
}

// dP = dO V^T, dS = P * (dP - rowsum(dO * O)) * scale, dQ = dS K, dK += dS^T Q, dV += P^T dO.
// dK/dV of a kv head accumulate over its query heads and blocks in a fixed order (deterministic).
void attention_bwd(const AttnShape& s, const float* q, const float* k, const float* v, const int32_t* seg,
                   const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  check_shape(s);
  const int64_t S = s.seq, H = s.heads, D = s.head_dim, group = s.heads / s.kv_heads;
  const int64_t q_ld = H * D, kv_ld = s.kv_heads * D;
  const int64_t bq = std::min(kQueryBlock, std::max<int64_t>(S, 1));
  std::fill(dk, dk + S * kv_ld, 0.0f);
  std::fill(dv, dv + S * kv_ld, 0.0f);
  Scratch& arena = Scratch::get(1);
  arena.reset(2 * bq * S, 2);
  float* p = arena.take(bq * S);
  float* dp = arena.take(bq * S);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / group;
    for (int64_t i0 = 0; i0 < S; i0 += bq) {
      const int64_t i1 = std::min(S, i0 + bq), n = i1 - i0;
      const float* qb = q + i0 * q_ld + h * D;
      const float* dob = dout + i0 * q_ld + h * D;
      sgemm(false, true, n, i1, D, s.scale, qb, q_ld, k + g * D, kv_ld, 0.0f, p, i1);
      block_probs(p, i0, i1, seg, lse + h * S, nullptr);
      sgemm(false, true, n, i1, D, 1.0f, dob, q_ld, v + g * D, kv_ld, 0.0f, dp, i1);
#pragma omp parallel for schedule(static) if (n * i1 > kParallelWork)
      for (int64_t r = 0; r < n; ++r) {
        const float d_i = dot(dob + r * q_ld, out + (i0 + r) * q_ld + h * D, D);  // sum_j p_j dp_j
        const float* pr = p + r * i1;
        float* dr = dp + r * i1;
#pragma omp simd
        for (int64_t j = 0; j < i1; ++j) dr[j] = pr[j] * (dr[j] - d_i) * s.scale;
      }
      sgemm(false, false, n, D, i1, 1.0f, dp, i1, k + g * D, kv_ld, 0.0f, dq + i0 * q_ld + h * D, q_ld);
      sgemm(true, false, i1, D, n, 1.0f, dp, i1, qb, q_ld, 1.0f, dk + g * D, kv_ld);
      sgemm(true, false, i1, D, n, 1.0f, p, i1, dob, q_ld, 1.0f, dv + g * D, kv_ld);
    }
  }
}

void attention_decode(const AttnShape& s, const float* q, const float* k_cache, const float* v_cache, int64_t n_ctx,
                      float* out) {
  check_shape(s);
  LT_CHECK(n_ctx > 0, "attention_decode: empty KV cache");
  const int64_t H = s.heads, D = s.head_dim, group = s.heads / s.kv_heads, kv_ld = s.kv_heads * D;
#pragma omp parallel for schedule(static) if (n_ctx * H * D > 65536)
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / group;
    std::vector<float> sc(static_cast<size_t>(n_ctx));
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n_ctx; ++j) {
      sc[size_t(j)] = dot(q + h * D, k_cache + j * kv_ld + g * D, D) * s.scale;
      m = std::max(m, sc[size_t(j)]);
    }
    double sum = 0;
    for (auto& x : sc) {
      x = std::exp(x - m);
      sum += x;
    }
    float* o = out + h * D;
    std::fill(o, o + D, 0.0f);
    for (int64_t j = 0; j < n_ctx; ++j) axpy(sc[size_t(j)], v_cache + j * kv_ld + g * D, o, D);
    const float inv = float(1.0 / sum);
    for (int64_t d = 0; d < D; ++d) o[d] *= inv;
  }
}

}  // namespace lt::cpu
