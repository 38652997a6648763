// The device-side AdamW step on the CPU backend (Backend::adamw_step), and the reference the CUDA kernel is tested
// against. Built with -ffp-contract=off (src/backend/CMakeLists.txt): each line below is one IEEE operation, in the
// order of the CPU optimizer's fp32 element update (optim/adamw_elem.h), so the two are bit-identical.
#include <cmath>

#include "backend/cpu/ops.h"
#include "core/split_master.h"

namespace lt::cpu {

namespace {

inline float adamw_elem(const AdamWStepScalars& s, float p, float g_in, float& m, float& v) {
  const float g = g_in * s.grad_scale;
  const float pp = p * s.decay;
  const float mm = m + s.w1 * (g - m);
  const float vv = v * s.beta2 + (s.w2 * g) * g;
  const float denom = std::sqrt(vv) / s.bc2_sqrt + s.eps;
  m = mm;
  v = vv;
  return pp + (s.neg_step_size * mm) / denom;
}

}  // namespace

void adamw_step(const AdamWStepScalars& s, float* p, bf16_t* hi, uint16_t* lo, const float* g, float* m, float* v,
                int64_t n) {
  if (p) {
    for (int64_t i = 0; i < n; ++i) p[i] = adamw_elem(s, p[i], g[i], m[i], v[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) split_master(adamw_elem(s, join_master(hi[i], lo[i]), g[i], m[i], v[i]), &hi[i], &lo[i]);
}

}  // namespace lt::cpu
