// Gated DeltaNet elementwise/row ops: causal depthwise conv1d + SiLU, L2 norm, gates, gated RMSNorm.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops_gdn.h"
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

// pre[t,c] for every channel of row t; taps before row `start` are skipped (they are zero). The products
// are exact in double and the sum of <= K terms is order-insensitive, so the decode step (which adds
// the zero taps) gives the same bits.
void conv_row(const float* x, const float* w, int64_t C, int64_t K, int64_t t, int64_t start, float* pre) {
  for (int64_t c = 0; c < C; ++c) {
    double acc = 0;
    for (int64_t i = 0; i < K; ++i) {
      const int64_t r = t - (K - 1) + i;
      if (r >= start) acc += double(w[c * K + i]) * double(x[r * C + c]);
    }
    pre[c] = float(acc);
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
#pragma omp parallel for schedule(static) if (S * C * K > kParallelWork)
  for (int64_t t = 0; t < S; ++t) {
    float* yr = y + t * C;
    conv_row(x, w, C, K, t, st[size_t(t)], yr);
    for (int64_t c = 0; c < C; ++c) yr[c] = yr[c] * sigmoidf(yr[c]);
  }
}

// dpre = dy * silu'(pre), silu'(p) = s (1 + p (1 - s)), s = sigmoid(p).
// dx[r,c] = sum_i w[c,i] dpre[r+K-1-i, c] over the taps whose output row is in r's segment;
// dw[c,i] += sum_t dpre[t,c] x[t-(K-1)+i, c] over valid taps, in row order.
void gdn_conv_silu_bwd(const float* x, const float* w, const float* dy, int64_t S, int64_t C, int64_t K,
                       const int32_t* seg, float* dx, float* dw) {
  LT_CHECK(S >= 0 && C > 0 && K > 0, "gdn_conv_silu: bad shape S={} C={} K={}", S, C, K);
  const auto st = segment_starts(seg, S);
  std::vector<float> dpre(size_t(S * C));
#pragma omp parallel for schedule(static) if (S * C * K > kParallelWork)
  for (int64_t t = 0; t < S; ++t) {
    float* dp = dpre.data() + t * C;
    conv_row(x, w, C, K, t, st[size_t(t)], dp);
    for (int64_t c = 0; c < C; ++c) {
      const float p = dp[c], s = sigmoidf(p);
      dp[c] = dy[t * C + c] * (s * (1.0f + p * (1.0f - s)));
    }
  }
  if (dx) {
#pragma omp parallel for schedule(static) if (S * C * K > kParallelWork)
    for (int64_t r = 0; r < S; ++r) {
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t i = 0; i < K; ++i) {
          const int64_t t = r + (K - 1) - i;
          if (t < S && st[size_t(t)] <= r) acc += double(w[c * K + i]) * double(dpre[size_t(t * C + c)]);
        }
        dx[r * C + c] = float(acc);
      }
    }
  }
  if (dw) {
    for (int64_t t = 0; t < S; ++t)  // row order: bit-identical under splits on sequence boundaries
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < K; ++i) {
          const int64_t r = t - (K - 1) + i;
          if (r >= st[size_t(t)]) dw[c * K + i] += dpre[size_t(t * C + c)] * x[r * C + c];
        }
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
    const float p = float(acc);
    for (int64_t i = 0; i + 1 < L; ++i) sc[i] = sc[i + 1];
    if (L > 0) sc[L - 1] = x_t[c];
    y_t[c] = p * sigmoidf(p);
  }
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
