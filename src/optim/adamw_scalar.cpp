// Portable scalar kernels: the reference for the vector paths and the fallback on old CPUs.
#include <algorithm>
#include <cmath>

#include "optim/adamw_elem.h"

namespace lt::optim::detail {

void adamw_f32_scalar(const AdamWScalars& s, float* p, const float* g, float* m, float* v, bf16_t* out,
                      int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    adamw_elem(s, p[i], g[i], m[i], v[i]);
    if (out) out[i] = f32_to_bf16(p[i]);
  }
}

void adamw_q8_scalar(const AdamWScalars& s, float* p, const float* g, uint8_t* mq, uint8_t* vq, float* ms,
                     float* vs, bf16_t* out, int64_t n) {
  const QuantMap& qm = signed_dynamic_map();
  const QuantMap& qv = unsigned_dynamic_map();
  float tm[kQ8Block], tv[kQ8Block];
  for (int64_t b0 = 0, blk = 0; b0 < n; b0 += kQ8Block, ++blk) {
    int64_t len = std::min<int64_t>(kQ8Block, n - b0);
    const float b1s = s.beta1 * ms[blk], b2s = s.beta2 * vs[blk];
    float am = 0.0f, av = 0.0f;
    for (int64_t i = 0; i < len; ++i) {
      float mm, vv;
      adamw_elem_q8(s, p[b0 + i], g[b0 + i], qm.decode[mq[b0 + i]], b1s, qv.decode[vq[b0 + i]] * b2s, mm, vv);
      if (out) out[b0 + i] = f32_to_bf16(p[b0 + i]);
      tm[i] = mm;
      tv[i] = vv;
      am = std::max(am, std::fabs(mm));
      av = std::max(av, vv);
    }
    ms[blk] = am;
    vs[blk] = av;
    float im = block_inv(am), iv = block_inv(av);
    for (int64_t i = 0; i < len; ++i) {
      mq[b0 + i] = quantize_one(qm, tm[i] * im);
      vq[b0 + i] = quantize_one(qv, tv[i] * iv);
    }
  }
}

double sumsq_scalar(const float* g, int64_t n) {
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) acc[k] += double(g[i + k]) * double(g[i + k]);
  for (; i < n; ++i) acc[0] += double(g[i]) * double(g[i]);
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

}  // namespace lt::optim::detail
