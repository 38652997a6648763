// Causal grouped-query attention for one sequence, with an optional segment mask (packed sequences).
// Row-at-a-time softmax: O(S) scratch per thread, never an [S,S] matrix per head.
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"
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

// Scaled scores of row i against rows 0..i (masked entries = -inf) into sc; returns their max.
inline float row_scores(const AttnShape& s, const float* qi, const float* k, int64_t kv_ld, const int32_t* seg,
                        int64_t i, float* sc) {
  const int64_t D = s.head_dim;
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j <= i; ++j) {
    if (!visible(seg, i, j)) {
      sc[j] = -std::numeric_limits<float>::infinity();
      continue;
    }
    sc[j] = dot(qi, k + j * kv_ld, D) * s.scale;
    m = std::max(m, sc[j]);
  }
  return m;
}

}  // namespace

void attention_fwd(const AttnShape& s, const float* q, const float* k, const float* v, const int32_t* seg, float* out,
                   float* lse) {
  check_shape(s);
  const int64_t S = s.seq, H = s.heads, D = s.head_dim, group = s.heads / s.kv_heads;
  const int64_t q_ld = H * D, kv_ld = s.kv_heads * D;
#pragma omp parallel if (S * S * H * D > kParallelWork)
  {
    std::vector<float> sc(static_cast<size_t>(S + 1));
    std::vector<float> acc(static_cast<size_t>(D));
#pragma omp for collapse(2) schedule(dynamic, 8)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < S; ++i) {
        const int64_t g = h / group;
        const float* qi = q + i * q_ld + h * D;
        const float* kg = k + g * D;
        const float* vg = v + g * D;
        float m = row_scores(s, qi, kg, kv_ld, seg, i, sc.data());
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          float p = std::exp(sc[size_t(j)] - m);  // exp(-inf) = 0 for masked entries
          sc[size_t(j)] = p;
          sum += p;
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j <= i; ++j)
          if (sc[size_t(j)] != 0.0f) axpy(sc[size_t(j)], vg + j * kv_ld, acc.data(), D);
        const float inv = float(1.0 / sum);
        float* oi = out + i * q_ld + h * D;
        for (int64_t d = 0; d < D; ++d) oi[d] = acc[size_t(d)] * inv;
        if (lse) lse[h * S + i] = m + float(std::log(sum));
      }
    }
  }
}

void attention_bwd(const AttnShape& s, const float* q, const float* k, const float* v, const int32_t* seg,
                   const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  check_shape(s);
  const int64_t S = s.seq, H = s.heads, D = s.head_dim, KVH = s.kv_heads, group = s.heads / s.kv_heads;
  const int64_t q_ld = H * D, kv_ld = KVH * D;
  // Each query head gets private dK/dV [S, D]; the heads of a group are summed afterwards in head order
  // (deterministic, no atomics).
  std::vector<float> dk_h(static_cast<size_t>(H * S * D)), dv_h(static_cast<size_t>(H * S * D));
#pragma omp parallel if (S * S * H * D > kParallelWork)
  {
    std::vector<float> p(static_cast<size_t>(S + 1));
#pragma omp for schedule(dynamic, 1)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      const float* kg = k + g * D;
      const float* vg = v + g * D;
      float* dkh = dk_h.data() + h * S * D;
      float* dvh = dv_h.data() + h * S * D;
      std::fill(dkh, dkh + S * D, 0.0f);
      std::fill(dvh, dvh + S * D, 0.0f);
      for (int64_t i = 0; i < S; ++i) {
        const float* qi = q + i * q_ld + h * D;
        const float* doi = dout + i * q_ld + h * D;
        float* dqi = dq + i * q_ld + h * D;
        const float l = lse[h * S + i];
        const float di = dot(doi, out + i * q_ld + h * D, D);  // sum_j p_j dp_j
        std::fill(dqi, dqi + D, 0.0f);
        for (int64_t j = 0; j <= i; ++j) {
          if (!visible(seg, i, j)) continue;
          const float pj = std::exp(dot(qi, kg + j * kv_ld, D) * s.scale - l);
          const float dpj = dot(doi, vg + j * kv_ld, D);
          const float ds = pj * (dpj - di) * s.scale;
          axpy(ds, kg + j * kv_ld, dqi, D);
          axpy(ds, qi, dkh + j * D, D);
          axpy(pj, doi, dvh + j * D, D);
        }
      }
    }
#pragma omp for collapse(2) schedule(static)
    for (int64_t j = 0; j < S; ++j) {
      for (int64_t g = 0; g < KVH; ++g) {
        float* dkj = dk + j * kv_ld + g * D;
        float* dvj = dv + j * kv_ld + g * D;
        std::fill(dkj, dkj + D, 0.0f);
        std::fill(dvj, dvj + D, 0.0f);
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          axpy(1.0f, dk_h.data() + (h * S + j) * D, dkj, D);
          axpy(1.0f, dv_h.data() + (h * S + j) * D, dvj, D);
        }
      }
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
