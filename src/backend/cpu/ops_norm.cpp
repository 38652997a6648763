// RMSNorm and per-head QK-norm, forward and backward.
#include <cmath>

#include "backend/cpu/ops.h"

namespace lt::cpu {

namespace {
inline float row_rstd(const float* x, int64_t d, float eps) {
  // fp32 statistics like HF (hidden_states.to(float32).pow(2).mean(-1)); accumulate in double for stability.
  double ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < d; ++i) ss += double(x[i]) * double(x[i]);
  float var = float(ss / double(d));
  return 1.0f / std::sqrt(var + eps);
}
}  // namespace

NormScale::NormScale(const float* w, int64_t d, bool plus_one) : p_(w) {
  if (!plus_one) return;
  buf_.resize(size_t(d));
  for (int64_t i = 0; i < d; ++i) buf_[size_t(i)] = 1.0f + w[i];
  p_ = buf_.data();
}

void rmsnorm_fwd(const float* x, const float* w, int64_t n, int64_t d, float eps, float* y) {
#pragma omp parallel for schedule(static) if (n * d > 32768)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    float rs = row_rstd(xr, d, eps);
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) yr[i] = w[i] * (xr[i] * rs);
  }
}

void rmsnorm_bwd(const float* x, const float* w, const float* dy, int64_t n, int64_t d, float eps, float* dx,
                 float* dw, bool accumulate_dx) {
  // xhat = x * rs; y = w * xhat.  dxhat = dy * w;  dx = rs * (dxhat - xhat * mean(dxhat * xhat)).
  if (dw) {
    for (int64_t r = 0; r < n; ++r) {  // row order: bit-identical under row splits
      const float* xr = x + r * d;
      const float* dyr = dy + r * d;
      float rs = row_rstd(xr, d, eps);
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) dw[i] += dyr[i] * (xr[i] * rs);
    }
  }
  if (!dx) return;
#pragma omp parallel for schedule(static) if (n * d > 32768)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    const float* dyr = dy + r * d;
    float* dxr = dx + r * d;
    float rs = row_rstd(xr, d, eps);
    double dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < d; ++i) dot += double(dyr[i] * w[i]) * double(xr[i] * rs);
    float c = float(dot / double(d));
    if (accumulate_dx) {
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) dxr[i] += rs * (dyr[i] * w[i] - (xr[i] * rs) * c);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) dxr[i] = rs * (dyr[i] * w[i] - (xr[i] * rs) * c);
    }
  }
}

void qk_norm_fwd(const float* x, const float* w, int64_t n, int64_t n_heads, int64_t head_dim, float eps, float* y) {
  rmsnorm_fwd(x, w, n * n_heads, head_dim, eps, y);
}

void qk_norm_bwd(const float* x, const float* w, const float* dy, int64_t n, int64_t n_heads, int64_t head_dim,
                 float eps, float* dx, float* dw) {
  rmsnorm_bwd(x, w, dy, n * n_heads, head_dim, eps, dx, dw);
}

}  // namespace lt::cpu
