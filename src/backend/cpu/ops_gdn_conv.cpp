// Gated DeltaNet elementwise/row ops: causal depthwise conv1d + SiLU, L2 norm, gates, gated RMSNorm.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops_gdn.h"
#include "backend/cpu/ops_gdn_rule_impl.h"
#include "core/error.h"

namespace lt::cpu {

namespace {

constexpr int64_t kParallelWork = 1 << 16;  // below this, thread start-up costs more than it saves

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Start row of the segment of every row (0 for all rows when seg == nullptr).
std::vector<int64_t> segment_starts(const int32_t* seg, int64_t S) {
  std::vector<int64_t> st(size_t(std::max<int64_t>(S, 0)));
  int64_t start = 0;
  for (int64_t t = 0; t < S; ++t) {
    if (t > 0 && seg && seg[t] != seg[t - 1]) start = t;
    st[size_t(t)] = start;
  }
  return st;
}

// wT[i * C + c] = w[c * K + i] (per-thread scratch, reused across calls).
const float* transposed_taps(const float* w, int64_t C, int64_t K) {
  thread_local std::vector<float> wT;
  wT.resize(size_t(C * K));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t i = 0; i < K; ++i) wT[size_t(i * C + c)] = w[c * K + i];
  return wT.data();
}

// pre[t,c] for every channel of row t (wT from transposed_taps; acc: [C] doubles); taps before row
// `start` are skipped (they are zero). The products are exact in double and are added in tap order, as
// the decode step does (its zero taps add nothing), so both give the same bits.
void conv_row(const float* x, const float* wT, int64_t C, int64_t K, int64_t t, int64_t start, float* pre,
              double* acc) {
  std::fill_n(acc, C, 0.0);
  for (int64_t i = 0; i < K; ++i) {
    const int64_t r = t - (K - 1) + i;
    if (r < start) continue;
    const float* wi = wT + i * C;
    const float* xr = x + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) acc[c] += double(wi[c]) * double(xr[c]);
  }
  for (int64_t c = 0; c < C; ++c) pre[c] = float(acc[c]);
}

// y = silu(pre) = pre sigmoid(pre) over n values, 8 lanes at a time (the tail through a padded copy, with
// the same lane operations). y may alias pre.
void silu_row(const float* pre, int64_t n, float* y) {
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m256 p = _mm256_loadu_ps(pre + c);
    _mm256_storeu_ps(y + c, _mm256_mul_ps(p, gdn_detail::sigmoid8(p)));
  }
  if (c < n) {
    alignas(32) float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::copy(pre + c, pre + n, t);
    const __m256 p = _mm256_load_ps(t);
    _mm256_store_ps(t, _mm256_mul_ps(p, gdn_detail::sigmoid8(p)));
    std::copy(t, t + (n - c), y + c);
  }
}

// dp = dy silu'(p) = dy s (1 + p (1 - s)), s = sigmoid(p), over n values (in place on p).
void silu_grad_row(const float* dy, int64_t n, float* p) {
  const __m256 one = _mm256_set1_ps(1.0f);
  auto f = [&](__m256 pv, __m256 dv) {
    const __m256 sv = gdn_detail::sigmoid8(pv);
    return _mm256_mul_ps(dv, _mm256_mul_ps(sv, _mm256_fmadd_ps(pv, _mm256_sub_ps(one, sv), one)));
  };
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) _mm256_storeu_ps(p + c, f(_mm256_loadu_ps(p + c), _mm256_loadu_ps(dy + c)));
  if (c < n) {
    alignas(32) float tp[8] = {0, 0, 0, 0, 0, 0, 0, 0}, td[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::copy(p + c, p + n, tp);
    std::copy(dy + c, dy + n, td);
    _mm256_store_ps(tp, f(_mm256_load_ps(tp), _mm256_load_ps(td)));
    std::copy(tp, tp + (n - c), p + c);
  }
}

// Sum of squares of a vector in double.
inline double sumsq(const float* x, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

// torch.nn.functional.softplus (beta 1, threshold 20) and its derivative.
inline float softplusf(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
inline float softplus_grad(float x) { return x > 20.0f ? 1.0f : sigmoidf(x); }

}  // namespace

// ---------------------------------------------------------------- conv1d + SiLU

void gdn_conv_silu_fwd(const float* x, const float* w, int64_t S, int64_t C, int64_t K, const int32_t* seg,
                       float* y) {
  LT_CHECK(S >= 0 && C > 0 && K > 0, "gdn_conv_silu: bad shape S={} C={} K={}", S, C, K);
  const auto st = segment_starts(seg, S);
  const float* wT = transposed_taps(w, C, K);
#pragma omp parallel if (S * C * K > kParallelWork)
  {
    thread_local std::vector<double> acc;
    acc.resize(size_t(C));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < S; ++t) {
      float* yr = y + t * C;
      conv_row(x, wT, C, K, t, st[size_t(t)], yr, acc.data());
      silu_row(yr, C, yr);
    }
  }
}

// dpre = dy * silu'(pre), silu'(p) = s (1 + p (1 - s)), s = sigmoid(p).
// dx[r,c] = sum_i w[c,i] dpre[r+K-1-i, c] over the taps whose output row is in r's segment;
// dw[c,i] += sum_t dpre[t,c] x[t-(K-1)+i, c] over valid taps, in row order.
void gdn_conv_silu_bwd(const float* x, const float* w, const float* dy, int64_t S, int64_t C, int64_t K,
                       const int32_t* seg, float* dx, float* dw) {
  LT_CHECK(S >= 0 && C > 0 && K > 0, "gdn_conv_silu: bad shape S={} C={} K={}", S, C, K);
  const auto st = segment_starts(seg, S);
  const float* wT = transposed_taps(w, C, K);
  thread_local std::vector<float> dpre_buf;  // [S, C], reused across calls
  dpre_buf.resize(size_t(S * C));
  float* dpre = dpre_buf.data();
#pragma omp parallel if (S * C * K > kParallelWork)
  {
    thread_local std::vector<double> acc;
    acc.resize(size_t(C));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < S; ++t) {
      float* dp = dpre + t * C;
      conv_row(x, wT, C, K, t, st[size_t(t)], dp, acc.data());
      silu_grad_row(dy + t * C, C, dp);
    }
    if (dx) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < S; ++r) {
        double* a = acc.data();
        std::fill_n(a, C, 0.0);
        for (int64_t i = 0; i < K; ++i) {
          const int64_t t = r + (K - 1) - i;
          if (t >= S || st[size_t(t)] > r) continue;
          const float* wi = wT + i * C;
          const float* dpt = dpre + t * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) a[c] += double(wi[c]) * double(dpt[c]);
        }
        for (int64_t c = 0; c < C; ++c) dx[r * C + c] = float(a[c]);
      }
    }
  }
  if (dw) {
    // Row order per element (bit-identical under splits on sequence boundaries), on a transposed copy.
    thread_local std::vector<float> dwT_buf;
    dwT_buf.resize(size_t(C * K));
    float* dwT = dwT_buf.data();
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < K; ++i) dwT[i * C + c] = dw[c * K + i];
    for (int64_t t = 0; t < S; ++t)
      for (int64_t i = 0; i < K; ++i) {
        const int64_t r = t - (K - 1) + i;
        if (r < st[size_t(t)]) continue;
        const float* dpt = dpre + t * C;
        const float* xr = x + r * C;
        float* di = dwT + i * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) di[c] = std::fma(dpt[c], xr[c], di[c]);
      }
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < K; ++i) dw[c * K + i] = dwT[i * C + c];
  }
}

void gdn_conv_silu_step(const float* x_t, const float* w, int64_t C, int64_t K, float* state, float* y_t) {
  LT_CHECK(C > 0 && K > 0, "gdn_conv_silu_step: bad shape C={} K={}", C, K);
  const int64_t L = K - 1;
  for (int64_t c = 0; c < C; ++c) {
    float* sc = state + c * L;
    double acc = 0;
    for (int64_t i = 0; i < L; ++i) acc += double(w[c * K + i]) * double(sc[i]);
    acc += double(w[c * K + L]) * double(x_t[c]);
    for (int64_t i = 0; i + 1 < L; ++i) sc[i] = sc[i + 1];
    if (L > 0) sc[L - 1] = x_t[c];
    y_t[c] = float(acc);
  }
  silu_row(y_t, C, y_t);  // the same lane operations as the full forward
}

// ---------------------------------------------------------------- L2 norm

void gdn_l2norm_fwd(const float* x, int64_t n_vec, int64_t D, float eps, float* y) {
#pragma omp parallel for schedule(static) if (n_vec * D > kParallelWork)
  for (int64_t v = 0; v < n_vec; ++v) {
    const float* xv = x + v * D;
    const float r = float(1.0 / std::sqrt(sumsq(xv, D) + double(eps)));
    for (int64_t i = 0; i < D; ++i) y[v * D + i] = xv[i] * r;
  }
}

// y = x r, r = (sum x^2 + eps)^(-1/2), dr/dx = -r^3 x  =>  dx = r dy - r^3 x (x . dy).
void gdn_l2norm_bwd(const float* x, const float* dy, int64_t n_vec, int64_t D, float eps, float* dx) {
#pragma omp parallel for schedule(static) if (n_vec * D > kParallelWork)
  for (int64_t v = 0; v < n_vec; ++v) {
    const float* xv = x + v * D;
    const float* dyv = dy + v * D;
    const double r = 1.0 / std::sqrt(sumsq(xv, D) + double(eps));
    double xdy = 0;
    for (int64_t i = 0; i < D; ++i) xdy += double(xv[i]) * double(dyv[i]);
    const float a = float(r), b = float(r * r * r * xdy);
    for (int64_t i = 0; i < D; ++i) dx[v * D + i] = a * dyv[i] - b * xv[i];
  }
}

// ---------------------------------------------------------------- gates

void gdn_gates_fwd(const float* a, const float* b, const float* A_log, const float* dt_bias, int64_t S, int64_t Hv,
                   float* g, float* beta) {
  for (int64_t t = 0; t < S; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t i = t * Hv + h;
      g[i] = -std::exp(A_log[h]) * softplusf(a[i] + dt_bias[h]);
      beta[i] = sigmoidf(b[i]);
    }
}

// z = a + dt_bias: dz = dg * (-exp(A_log)) * softplus'(z); da = dz; ddt_bias += dz;
// dA_log += dg * g (d/dA_log of -exp(A_log) sp = g); db = dbeta * beta (1 - beta).
void gdn_gates_bwd(const float* a, const float* b, const float* A_log, const float* dt_bias, const float* dg,
                   const float* dbeta, int64_t S, int64_t Hv, float* da, float* db, float* dA_log, float* ddt_bias) {
  for (int64_t t = 0; t < S; ++t)  // row order for the parameter gradients
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t i = t * Hv + h;
      const float z = a[i] + dt_bias[h], e = std::exp(A_log[h]);
      const float dz = dg[i] * (-e * softplus_grad(z));
      if (da) da[i] = dz;
      if (ddt_bias) ddt_bias[h] += dz;
      if (dA_log) dA_log[h] += dg[i] * (-e * softplusf(z));
      const float s = sigmoidf(b[i]);
      if (db) db[i] = dbeta[i] * (s * (1.0f - s));
    }
}

// ---------------------------------------------------------------- gated RMSNorm

void gdn_gated_rmsnorm_fwd(const float* x, const float* z, const float* w, int64_t n_vec, int64_t D, float eps,
                           float* y) {
#pragma omp parallel for schedule(static) if (n_vec * D > kParallelWork)
  for (int64_t v = 0; v < n_vec; ++v) {
    const float* xv = x + v * D;
    const float* zv = z + v * D;
    const float r = 1.0f / std::sqrt(float(sumsq(xv, D) / double(D)) + eps);
    for (int64_t i = 0; i < D; ++i) y[v * D + i] = (w[i] * (xv[i] * r)) * (zv[i] * sigmoidf(zv[i]));
  }
}

// n = x r; y = w n silu(z).  dn = dy w silu(z);  dx = r (dn - n mean(dn n));
// dz = dy w n silu'(z);  dw += dy n silu(z).
void gdn_gated_rmsnorm_bwd(const float* x, const float* z, const float* w, const float* dy, int64_t n_vec, int64_t D,
                           float eps, float* dx, float* dz, float* dw) {
  auto rstd = [&](const float* xv) { return 1.0f / std::sqrt(float(sumsq(xv, D) / double(D)) + eps); };
  if (dw) {
    for (int64_t v = 0; v < n_vec; ++v) {  // vector order
      const float* xv = x + v * D;
      const float* zv = z + v * D;
      const float r = rstd(xv);
      for (int64_t i = 0; i < D; ++i) dw[i] += dy[v * D + i] * (xv[i] * r) * (zv[i] * sigmoidf(zv[i]));
    }
  }
#pragma omp parallel for schedule(static) if (n_vec * D > kParallelWork)
  for (int64_t v = 0; v < n_vec; ++v) {
    const float* xv = x + v * D;
    const float* zv = z + v * D;
    const float* dyv = dy + v * D;
    const float r = rstd(xv);
    double dot = 0;
    for (int64_t i = 0; i < D; ++i) {
      const float s = sigmoidf(zv[i]);
      dot += double(dyv[i] * w[i] * (zv[i] * s)) * double(xv[i] * r);
    }
    const float c = float(dot / double(D));
    for (int64_t i = 0; i < D; ++i) {
      const float s = sigmoidf(zv[i]), n = xv[i] * r, dyw = dyv[i] * w[i];
      if (dx) dx[v * D + i] = r * (dyw * (zv[i] * s) - n * c);
      if (dz) dz[v * D + i] = dyw * n * (s * (1.0f + zv[i] * (1.0f - s)));
    }
  }
}

}  // namespace lt::cpu
