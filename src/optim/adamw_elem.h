// Scalar element operations shared by every kernel path (the vector paths use them for tails), so
// that all paths perform identical IEEE operations. Internal to src/optim.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "optim/adamw_kernels.h"
#include "optim/quant8.h"

namespace lt::optim::detail {
namespace {

// One AdamW element: updates p, m, v in place (see adamw_kernels.h for the formulas).
inline void adamw_elem(const AdamWScalars& s, float& p, float g_in, float& m, float& v) {
  float g = g_in * s.grad_scale;
  float pp = p * s.decay;
  float mm = m + s.w1 * (g - m);
  float vv = v * s.beta2 + (s.w2 * g) * g;
  float denom = std::sqrt(vv) / s.bc2_sqrt + s.eps;
  p = pp + (s.neg_step_size * mm) / denom;
  m = mm;
  v = vv;
}

// The 8-bit path's element update (adamw_kernels.h: fused multiply-adds, no division by bc2_sqrt).
inline void adamw_elem_q8(const AdamWScalars& s, float& p, float g_in, float& m, float& v) {
  float g = g_in * s.grad_scale;
  float mm = std::fma(s.w1, g - m, m);
  float vv = std::fma(s.w2 * g, g, v * s.beta2);
  float denom = std::fma(std::sqrt(vv), s.inv_bc2_sqrt, s.eps);
  p = std::fma(p, s.decay, (s.neg_step_size * mm) / denom);
  m = mm;
  v = vv;
}

inline float block_inv(float amax) { return amax > 0.0f ? 1.0f / amax : 0.0f; }

}  // namespace
}  // namespace lt::optim::detail
