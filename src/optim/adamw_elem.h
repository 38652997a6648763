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

// The 8-bit path's element update (adamw_kernels.h): dm is m's decoded code (unscaled), b1s = beta1 *
// (m's block scale), vb = v's decoded code * (beta2 * v's block scale). Writes the new m and v.
inline void adamw_elem_q8(const AdamWScalars& s, float& p, float g_in, float dm, float b1s, float vb, float& m,
                          float& v) {
  float g = g_in * s.grad_scale;
  m = std::fma(b1s, dm, s.w1 * g);
  v = std::fma(s.w2 * g, g, vb);
  float denom = std::fma(std::sqrt(v), s.inv_bc2_sqrt, s.eps);
  p = std::fma(p, s.decay, (s.neg_step_size * m) / denom);
}

}  // namespace
}  // namespace lt::optim::detail
