// AVX-512 pieces shared by the fp32 and 8-bit kernels (adamw_avx512.cpp, adamw_q8_avx512.cpp). Include
// it only AFTER a `#pragma GCC target` that enables AVX-512 F/BW/DQ/VL: everything here has internal
// linkage, so each of those files gets its own copy compiled for its own target.
#pragma once
// Both including files include these (and adamw_kernels.h) before their pragma already, so nothing
// from them is compiled for the AVX-512 target here; listed for what this header uses.
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "optim/adamw_kernels.h"

namespace lt::optim::detail {
namespace {

struct V {
  __m512 decay, w1, beta2, w2, eps, bc2, nss, gs;
  // 8-bit path: the denominator divided by the step size, so that the step is m * rcp(denom / nss) with
  // no separate multiplication (see q8_stage_a). A zero (or denormal) step size, e.g. lr = 0 in warm-up,
  // makes that denominator -inf for every sqrt(v) in [0, +inf] (a finite negative factor, not 0, so that
  // sqrt(v) = +inf gives -inf and not NaN): its reciprocal is -0 and the step exactly 0. (A step that
  // small would change no master of magnitude above ~1e-30 anyway.)
  __m512 ibc2n, epsn;
  explicit V(const AdamWScalars& s)
      : decay(_mm512_set1_ps(s.decay)), w1(_mm512_set1_ps(s.w1)), beta2(_mm512_set1_ps(s.beta2)),
        w2(_mm512_set1_ps(s.w2)), eps(_mm512_set1_ps(s.eps)), bc2(_mm512_set1_ps(s.bc2_sqrt)),
        nss(_mm512_set1_ps(s.neg_step_size)), gs(_mm512_set1_ps(s.grad_scale)) {
    // A step size so small that a quotient overflows (|nss| below ~1e-37) counts as zero too: an
    // infinite factor would turn sqrt(v) = 0 into NaN.
    const float qb = s.inv_bc2_sqrt / s.neg_step_size, qe = s.eps / s.neg_step_size;
    const bool live = std::fabs(s.neg_step_size) >= std::numeric_limits<float>::min() && std::isfinite(qb) &&
                      std::isfinite(qe);
    ibc2n = _mm512_set1_ps(live ? qb : -1.0f);
    epsn = _mm512_set1_ps(live ? qe : -std::numeric_limits<float>::infinity());
  }
};

// Same operation order as adamw_elem.
inline void step16(const V& c, __m512& p, __m512 gin, __m512& m, __m512& v) {
  __m512 g = _mm512_mul_ps(gin, c.gs);
  __m512 pp = _mm512_mul_ps(p, c.decay);
  m = _mm512_add_ps(m, _mm512_mul_ps(c.w1, _mm512_sub_ps(g, m)));
  v = _mm512_add_ps(_mm512_mul_ps(v, c.beta2), _mm512_mul_ps(_mm512_mul_ps(c.w2, g), g));
  __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), c.bc2), c.eps);
  p = _mm512_add_ps(pp, _mm512_div_ps(_mm512_mul_ps(c.nss, m), denom));
}

// The 8-bit path's update in two stages: m and v exactly as adamw_elem_q8, then the step with the square
// root and the division from the hardware estimates vrsqrt14ps / vrcp14ps (relative error < 2^-14 each,
// so the step's relative error is below 2^-13 = 1.2e-4, against the percent-level error of the 8-bit
// moments themselves). The divider (sqrt + div: ~21 cycles per 16 elements here) was the largest single
// cost of the 8-bit update; Newton refinements of the estimates cost 5 more operations per vector.
// The kernel runs stage A one vector pair ahead of stage B (software pipelining): each stage's
// dependency chain is half the whole, so fewer waiting operations fill the scheduler.
// The kernel is bound by the two vector ports (512-bit operations issue on ports 0 and 5 only), so each
// operation saved per vector counts: the step size is folded into the denominator (denom / nss), and
// the special cases of the square root are fixed up after it in one instruction.
struct Q8Moments {
  __m512 m, v;
  __m512 denom_nss;  // (sqrt(v) / sqrt(1 - beta2^t) + eps) / nss: negative, or -inf for a zero step size
};
// In: dm = m's decoded code (unscaled), vb = v's decoded code * beta2 * its block scale, b1s = beta1 *
// m's block scale (adamw_kernels.h): the block scales cost no separate multiplication.
template <bool Scaled>
inline Q8Moments q8_stage_a(const V& c, __m512 b1s, __m512 gin, __m512 dm, __m512 vb) {
  __m512 g = Scaled ? _mm512_mul_ps(gin, c.gs) : gin;  // grad_scale 1 (no clipping): g * 1 == g
  __m512 m = _mm512_fmadd_ps(b1s, dm, _mm512_mul_ps(c.w1, g));
  __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(c.w2, g), g, vb);
  // sqrt(v) ~ v * rsqrt(v), except v = 0 (a stored zero: 0 * inf) and v = +inf (an unclipped gradient
  // above ~1e20: inf * 0), whose NaN vfixupimmps replaces by +0 and +inf (table: class "zero" -> token
  // 8 (+0), class "+inf" -> token 1 (the source, v)). Denormal v is not flushed: vrsqrt14ps estimates it like any other.
  __m512 s = _mm512_mul_ps(v, _mm512_rsqrt14_ps(v));
  s = _mm512_fixupimm_ps(s, v, _mm512_set1_epi32(0x00100800), 0);
  return {m, v, _mm512_fmadd_ps(s, c.ibc2n, c.epsn)};
}
// p * (1 - lr*wd) + m * rcp(denom / nss) = p * (1 - lr*wd) + (-(lr / (1-beta1^t)) * m) / denom.
inline __m512 q8_stage_b(const V& c, __m512 p, const Q8Moments& a) {
  return _mm512_fmadd_ps(p, c.decay, _mm512_mul_ps(a.m, _mm512_rcp14_ps(a.denom_nss)));
}

// f32 -> bf16 rounded to nearest even in 32-bit lanes (the result is in the high halves); NaN kept quiet
// (as lt::f32_to_bf16): u + 0x7fff, plus 1 where bit 16 (the bf16 lsb) is set.
inline __m512i bf16_rounded(__m512 x) {
  __m512i u = _mm512_castps_si512(x);
  __m512i r = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
  r = _mm512_mask_add_epi32(r, _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x10000)), r, _mm512_set1_epi32(1));
  // NaN lanes take x quieted (u | 0x400000): vfixupimmps with the token 2 ("QNaN of the source") for the
  // quiet and signalling NaN classes and 0 ("keep the destination") for every other class. One
  // instruction instead of a class test (a port-5 compare) and a masked blend.
  return _mm512_castps_si512(_mm512_fixupimm_ps(_mm512_castsi512_ps(r), x, _mm512_set1_epi32(0x22), 0));
}
// The 16-bit halves (High: bits 16-31, else 0-15) of two vectors' 32-bit lanes -> 32 words in element
// order, with one permute. Vbmi (only where the including file's target has AVX-512 VBMI, as the 8-bit
// kernel's does): a byte permute (2 uops; the word permute takes 3), bytes 4i + 2 High and 4i + 2 High + 1
// of each lane i of x0 (indices 0-63), then of x1 (64-127).
template <bool High>
struct HalfIdx {
  alignas(64) int8_t bytes[64];
  int16_t words[32];
  constexpr HalfIdx() : bytes(), words() {
    for (int i = 0; i < 32; ++i) {
      bytes[2 * i] = int8_t(4 * i + (High ? 2 : 0));
      bytes[2 * i + 1] = int8_t(4 * i + (High ? 3 : 1));
      words[i] = int16_t(2 * i + (High ? 1 : 0));
    }
  }
};
template <bool Vbmi, bool High>
inline __m512i halves(__m512i x0, __m512i x1) {
  static constexpr HalfIdx<High> kIdx{};
  if constexpr (Vbmi) return _mm512_permutex2var_epi8(x0, _mm512_load_si512(kIdx.bytes), x1);
  else return _mm512_permutex2var_epi16(x0, _mm512_loadu_si512(kIdx.words), x1);
}
// Two vectors of f32 -> 32 bf16.
template <bool Vbmi>
inline __m512i to_bf16x2(__m512 x0, __m512 x1) {
  return halves<Vbmi, true>(bf16_rounded(x0), bf16_rounded(x1));
}

// One vector of f32 -> 16 bf16.
inline __m256i to_bf16(__m512 x) { return _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_rounded(x), 16)); }

}  // namespace
}  // namespace lt::optim::detail
