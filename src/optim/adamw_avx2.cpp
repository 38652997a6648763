// AVX2 kernels (8 floats per vector); see adamw_avx512.cpp for the structure. Headers come before the
// target pragma on purpose.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "optim/adamw_elem.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi2")

namespace lt::optim::detail {
namespace {

struct V {
  __m256 decay, w1, beta2, w2, eps, bc2, ibc2, nss, gs;
  explicit V(const AdamWScalars& s)
      : decay(_mm256_set1_ps(s.decay)), w1(_mm256_set1_ps(s.w1)), beta2(_mm256_set1_ps(s.beta2)),
        w2(_mm256_set1_ps(s.w2)), eps(_mm256_set1_ps(s.eps)), bc2(_mm256_set1_ps(s.bc2_sqrt)),
        ibc2(_mm256_set1_ps(s.inv_bc2_sqrt)),
        nss(_mm256_set1_ps(s.neg_step_size)), gs(_mm256_set1_ps(s.grad_scale)) {}
};

inline void step8(const V& c, __m256& p, __m256 gin, __m256& m, __m256& v) {
  __m256 g = _mm256_mul_ps(gin, c.gs);
  __m256 pp = _mm256_mul_ps(p, c.decay);
  m = _mm256_add_ps(m, _mm256_mul_ps(c.w1, _mm256_sub_ps(g, m)));
  v = _mm256_add_ps(_mm256_mul_ps(v, c.beta2), _mm256_mul_ps(_mm256_mul_ps(c.w2, g), g));
  __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), c.bc2), c.eps);
  p = _mm256_add_ps(pp, _mm256_div_ps(_mm256_mul_ps(c.nss, m), denom));
}

// The 8-bit path's update: the same operations as adamw_elem_q8. In: m = decoded code (unscaled), v =
// decoded code * beta2 * block scale; out: the new m and v.
inline void step8_q8(const V& c, __m256 b1s, __m256& p, __m256 gin, __m256& m, __m256& v) {
  __m256 g = _mm256_mul_ps(gin, c.gs);
  m = _mm256_fmadd_ps(b1s, m, _mm256_mul_ps(c.w1, g));
  v = _mm256_fmadd_ps(_mm256_mul_ps(c.w2, g), g, v);
  __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), c.ibc2, c.eps);
  p = _mm256_fmadd_ps(p, c.decay, _mm256_div_ps(_mm256_mul_ps(c.nss, m), denom));
}

// 8 floats -> 8 bf16 in the low half of 8 int32 lanes (values <= 0xffff).
inline __m256i bf16_lanes(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  // abs > 0x7f800000 as signed compare is fine: abs < 2^31.
  __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(r, q, nan);
}
// Two groups of 8 lanes (values <= 0xffff) -> 16 uint16 in order.
inline __m256i pack16(__m256i a, __m256i b) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
}
// Two groups of 8 lanes (values <= 0xff) -> 16 bytes in order.
inline __m128i pack8(__m256i a, __m256i b) {
  __m256i w = pack16(a, b);  // 16 x u16
  return _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}

// The map's decade tables in registers (indexed by decade with a lane permute, no gathers).
template <bool Signed>
struct QV {
  static constexpr int kBits = Signed ? 7 : 8;
  __m256 step, base, inv, off;
  __m256 tops[8];
  explicit QV(const QuantMap& q) {
    step = _mm256_loadu_ps(q.step);
    base = _mm256_loadu_ps(q.base);
    inv = _mm256_loadu_ps(q.inv_step);
    off = _mm256_loadu_ps(q.code_off);
    for (int t = 0; t < 8; ++t) tops[t] = _mm256_set1_ps(q.top[t]);
  }
};

// Nearest code of 8 values (int32 lanes): the same operations as quantize_one.
template <bool Signed>
inline __m256i quant8(const QV<Signed>& q, __m256 y) {
  __m256i bits = _mm256_castps_si256(y);
  __m256 a = _mm256_castsi256_ps(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)));
  __m256i e = _mm256_setzero_si256();
  for (int t = 1; t < QV<Signed>::kBits; ++t)  // true lanes are -1
    e = _mm256_sub_epi32(e, _mm256_castps_si256(_mm256_cmp_ps(a, q.tops[t], _CMP_LT_OQ)));
  __m256 cf = _mm256_fmadd_ps(a, _mm256_permutevar8x32_ps(q.inv, e), _mm256_permutevar8x32_ps(q.off, e));
  __m256i code = _mm256_cvtps_epi32(cf);
  if (Signed) return _mm256_or_si256(code, _mm256_slli_epi32(_mm256_srli_epi32(bits, 31), 7));
  return _mm256_andnot_si256(_mm256_castps_si256(_mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_EQ_OQ)), code);
}

// 8 codes -> their levels: the same operation that built QuantMap::decode, fma(step_e, c, base_e).
template <bool Signed>
inline __m256 dequant8(const QV<Signed>& q, const uint8_t* codes) {
  __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  __m256i mc = Signed ? _mm256_and_si256(c, _mm256_set1_epi32(0x7f)) : c;
  __m256i e = _mm256_setzero_si256();
  for (int t = 1; t < QV<Signed>::kBits; ++t)
    e = _mm256_sub_epi32(e, _mm256_cmpgt_epi32(_mm256_set1_epi32(1 << (QV<Signed>::kBits - t)), mc));
  __m256 val = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(q.step, e), _mm256_cvtepi32_ps(mc),
                               _mm256_permutevar8x32_ps(q.base, e));
  __m256i is_zero = _mm256_cmpeq_epi32(mc, _mm256_setzero_si256());
  val = _mm256_andnot_ps(_mm256_castsi256_ps(is_zero), val);
  if (Signed)
    val = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(val), _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24)));
  return val;
}

inline float hmax(__m256 x) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

}  // namespace

void adamw_f32_avx2(const AdamWScalars& s, float* p, const float* g, float* m, float* v, bf16_t* out,
                    int64_t n) {
  const V c(s);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 p0 = _mm256_loadu_ps(p + i), m0 = _mm256_loadu_ps(m + i), v0 = _mm256_loadu_ps(v + i);
    __m256 p1 = _mm256_loadu_ps(p + i + 8), m1 = _mm256_loadu_ps(m + i + 8), v1 = _mm256_loadu_ps(v + i + 8);
    step8(c, p0, _mm256_loadu_ps(g + i), m0, v0);
    step8(c, p1, _mm256_loadu_ps(g + i + 8), m1, v1);
    _mm256_storeu_ps(p + i, p0);
    _mm256_storeu_ps(m + i, m0);
    _mm256_storeu_ps(v + i, v0);
    _mm256_storeu_ps(p + i + 8, p1);
    _mm256_storeu_ps(m + i + 8, m1);
    _mm256_storeu_ps(v + i + 8, v1);
    if (out) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), pack16(bf16_lanes(p0), bf16_lanes(p1)));
  }
  for (; i < n; ++i) {
    adamw_elem(s, p[i], g[i], m[i], v[i]);
    if (out) out[i] = f32_to_bf16(p[i]);
  }
}

void adamw_q8_avx2(const AdamWScalars& s, float* p, const float* g, uint8_t* mq, uint8_t* vq, float* ms,
                   float* vs, bf16_t* out, int64_t n) {
  const QV<true> qm(signed_dynamic_map());
  const QV<false> qv(unsigned_dynamic_map());
  const V c(s);
  alignas(64) float tm[kQ8Block], tv[kQ8Block];
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t b0 = 0, blk = 0; b0 < n; b0 += kQ8Block, ++blk) {
    int64_t len = std::min<int64_t>(kQ8Block, n - b0);
    if (len < kQ8Block) {
      adamw_q8_scalar(s, p + b0, g + b0, mq + b0, vq + b0, ms + blk, vs + blk, out ? out + b0 : nullptr, len);
      break;
    }
    const __m256 b1s = _mm256_set1_ps(s.beta1 * ms[blk]), b2s = _mm256_set1_ps(s.beta2 * vs[blk]);
    __m256 am = _mm256_setzero_ps(), av = _mm256_setzero_ps();
    float* pb = p + b0;
    const float* gb = g + b0;
    for (int64_t i = 0; i < kQ8Block; i += 16) {
      __m256 m0 = dequant8(qm, mq + b0 + i), m1 = dequant8(qm, mq + b0 + i + 8);
      __m256 v0 = _mm256_mul_ps(dequant8(qv, vq + b0 + i), b2s), v1 = _mm256_mul_ps(dequant8(qv, vq + b0 + i + 8), b2s);
      __m256 p0 = _mm256_loadu_ps(pb + i), p1 = _mm256_loadu_ps(pb + i + 8);
      step8_q8(c, b1s, p0, _mm256_loadu_ps(gb + i), m0, v0);
      step8_q8(c, b1s, p1, _mm256_loadu_ps(gb + i + 8), m1, v1);
      _mm256_storeu_ps(pb + i, p0);
      _mm256_storeu_ps(pb + i + 8, p1);
      if (out) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + b0 + i), pack16(bf16_lanes(p0), bf16_lanes(p1)));
      _mm256_store_ps(tm + i, m0);
      _mm256_store_ps(tm + i + 8, m1);
      _mm256_store_ps(tv + i, v0);
      _mm256_store_ps(tv + i + 8, v1);
      am = _mm256_max_ps(am, _mm256_max_ps(_mm256_and_ps(m0, absmask), _mm256_and_ps(m1, absmask)));
      av = _mm256_max_ps(av, _mm256_max_ps(v0, v1));
    }
    float amax = hmax(am), vmax = hmax(av);
    ms[blk] = amax;
    vs[blk] = vmax;
    const __m256 im = _mm256_set1_ps(block_inv(amax)), iv = _mm256_set1_ps(block_inv(vmax));
    for (int64_t i = 0; i < kQ8Block; i += 16) {
      __m256i a = quant8(qm, _mm256_mul_ps(_mm256_load_ps(tm + i), im));
      __m256i b = quant8(qm, _mm256_mul_ps(_mm256_load_ps(tm + i + 8), im));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(mq + b0 + i), pack8(a, b));
      a = quant8(qv, _mm256_mul_ps(_mm256_load_ps(tv + i), iv));
      b = quant8(qv, _mm256_mul_ps(_mm256_load_ps(tv + i + 8), iv));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(vq + b0 + i), pack8(a, b));
    }
  }
}

double sumsq_avx2(const float* g, int64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(g + i);
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    a0 = _mm256_fmadd_pd(lo, lo, a0);
    a1 = _mm256_fmadd_pd(hi, hi, a1);
  }
  __m256d a = _mm256_add_pd(a0, a1);
  __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  double acc = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
  for (; i < n; ++i) acc += double(g[i]) * double(g[i]);
  return acc;
}

}  // namespace lt::optim::detail

#pragma GCC pop_options
