// The device-side AdamW step on the CPU backend (Backend::adamw_step, adamw_step_q8), and the reference the CUDA
// kernels are tested against. Built with -ffp-contract=off (src/backend/CMakeLists.txt): each line below is one IEEE
// operation, in the order of the CPU optimizer's element updates (optim/adamw_elem.h) and 8-bit quantiser
// (optim/quant8.h), so the two are bit-identical.
#include <algorithm>
#include <cmath>
#include <limits>

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

// optim::detail::adamw_elem_q8: dm m's decoded code, b1s = beta1 * m's scale, vb = v's decoded code * (beta2 * v's
// scale). Writes the new m and v, returns the new master.
inline float adamw_elem_q8(const AdamWStepScalars& s, float p, float g_in, float dm, float b1s, float vb, float& m,
                           float& v) {
  const float g = g_in * s.grad_scale;
  m = std::fma(b1s, dm, s.w1 * g);
  v = std::fma(s.w2 * g, g, vb);
  const float denom = std::fma(std::sqrt(v), s.inv_bc2_sqrt, s.eps);
  return std::fma(p, s.decay, (s.neg_step_size * m) / denom);
}

// optim::quantize_one on the backend's copy of the map: the decade by comparisons with its tops, the decade's line,
// round to nearest even.
inline uint8_t quantize_q8(const Q8Map& q, float y) {
  const uint32_t bits = f32_bits(y);
  const float a = bits_f32(bits & 0x7fffffffu);
  int e = 0;
  for (int t = 1; t < q.mag_bits; ++t) e += a < q.top[t] ? 1 : 0;
  const float cf = std::fma(a, q.inv_step[e], q.code_off[e]);
  if (!(cf > -1.0f && cf < 256.0f)) return 0;  // non-finite y (converting NaN or inf to int is undefined)
  constexpr float kRound = 12582912.0f;        // 1.5 * 2^23: the sum's low mantissa bits are the rounded integer
  int32_t code = int32_t((cf + kRound) - kRound);
  if (q.is_signed) code |= int32_t((bits >> 31) << 7);
  else if (a == 0.0f) code = 0;
  return uint8_t(code);
}

// optim::block_inv: 0 for a block below FLT_MIN (1 / absmax would overflow), so all its codes are 0.
inline float block_inv_q8(float absmax) {
  return absmax >= std::numeric_limits<float>::min() ? 1.0f / absmax : 0.0f;
}

}  // namespace

void adamw_step_q8(const AdamWStepScalars& s, const Q8Maps& maps, float* p, bf16_t* hi, uint16_t* lo, const float* g,
                   uint8_t* mq, uint8_t* vq, float* ms, float* vs, int64_t n) {
  constexpr int64_t kBlock = 256;  // optim::kQ8Block
  float tm[kBlock], tv[kBlock];
  for (int64_t b0 = 0, blk = 0; b0 < n; b0 += kBlock, ++blk) {
    const int64_t len = std::min(kBlock, n - b0);
    const float b1s = s.beta1 * ms[blk], b2s = s.beta2 * vs[blk];
    float am = 0.0f, av = 0.0f;
    for (int64_t i = 0; i < len; ++i) {
      const int64_t k = b0 + i;
      const float dm = maps.m.decode[mq[k]], vb = maps.v.decode[vq[k]] * b2s;
      float mm, vv;
      if (p) {
        p[k] = adamw_elem_q8(s, p[k], g[k], dm, b1s, vb, mm, vv);
      } else {
        split_master(adamw_elem_q8(s, join_master(hi[k], lo[k]), g[k], dm, b1s, vb, mm, vv), &hi[k], &lo[k]);
      }
      tm[i] = mm;
      tv[i] = vv;
      am = std::max(am, std::fabs(mm));
      av = std::max(av, vv);
    }
    ms[blk] = am;
    vs[blk] = av;
    const float im = block_inv_q8(am), iv = block_inv_q8(av);
    for (int64_t i = 0; i < len; ++i) {
      mq[b0 + i] = quantize_q8(maps.m, tm[i] * im);
      vq[b0 + i] = quantize_q8(maps.v, tv[i] * iv);
    }
  }
}

void adamw_step(const AdamWStepScalars& s, float* p, bf16_t* hi, uint16_t* lo, const float* g, float* m, float* v,
                int64_t n) {
  if (p) {
    for (int64_t i = 0; i < n; ++i) p[i] = adamw_elem(s, p[i], g[i], m[i], v[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) split_master(adamw_elem(s, join_master(hi[i], lo[i]), g[i], m[i], v[i]), &hi[i], &lo[i]);
}

}  // namespace lt::cpu
