// AVX-512 kernels (16 floats per vector): fp32 AdamW and the sum of squares. Compiled with a target
// pragma and chosen at run time, so the library still runs on CPUs without AVX-512 (F/BW/DQ/VL/CD);
// the 8-bit kernel, which also needs VBMI, is in adamw_q8_avx512.cpp. All shared headers are
// included BEFORE the pragma so that no inline function of theirs is emitted with AVX-512 code;
// adamw_avx512_common.h is AVX-512 only and comes after it.
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "core/split_master.h"
#include "optim/adamw_elem.h"

#pragma GCC push_options
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 false positive in avx512fintrin.h
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512cd,avx2,fma,bmi2")

#include "optim/adamw_avx512_common.h"
#include "optim/adamw_avx512_masters.h"

namespace lt::optim::detail {

void adamw_f32_avx512(const AdamWScalars& s, float* p, const float* g, float* m, float* v, bf16_t* out,
                      int64_t n) {
  const V c(s);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 p0 = _mm512_loadu_ps(p + i), m0 = _mm512_loadu_ps(m + i), v0 = _mm512_loadu_ps(v + i);
    __m512 p1 = _mm512_loadu_ps(p + i + 16), m1 = _mm512_loadu_ps(m + i + 16), v1 = _mm512_loadu_ps(v + i + 16);
    step16(c, p0, _mm512_loadu_ps(g + i), m0, v0);
    step16(c, p1, _mm512_loadu_ps(g + i + 16), m1, v1);
    _mm512_storeu_ps(p + i, p0);
    _mm512_storeu_ps(m + i, m0);
    _mm512_storeu_ps(v + i, v0);
    _mm512_storeu_ps(p + i + 16, p1);
    _mm512_storeu_ps(m + i + 16, m1);
    _mm512_storeu_ps(v + i + 16, v1);
    if (out) _mm512_storeu_si512(out + i, to_bf16x2<false>(p0, p1));
  }
  for (; i + 16 <= n; i += 16) {
    __m512 pv = _mm512_loadu_ps(p + i), mv = _mm512_loadu_ps(m + i), vv = _mm512_loadu_ps(v + i);
    step16(c, pv, _mm512_loadu_ps(g + i), mv, vv);
    _mm512_storeu_ps(p + i, pv);
    _mm512_storeu_ps(m + i, mv);
    _mm512_storeu_ps(v + i, vv);
    if (out) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16(pv));
  }
  for (; i < n; ++i) {
    adamw_elem(s, p[i], g[i], m[i], v[i]);
    if (out) out[i] = f32_to_bf16(p[i]);
  }
}

namespace {
// adamw_f32_avx512 over masters and gradients in their storage forms (MasterVecs).
template <MasterFormat F, bool G16>
void f32_fused(const AdamWScalars& s, const MasterIo& io, float* m, float* v, int64_t n) {
  const V c(s);
  const MasterVecs<F, G16, false> mv{io};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 p0, p1, g0, g1;
    mv.load(i, p0, p1);
    mv.grad(i, g0, g1);
    __m512 m0 = _mm512_loadu_ps(m + i), v0 = _mm512_loadu_ps(v + i);
    __m512 m1 = _mm512_loadu_ps(m + i + 16), v1 = _mm512_loadu_ps(v + i + 16);
    step16(c, p0, g0, m0, v0);
    step16(c, p1, g1, m1, v1);
    _mm512_storeu_ps(m + i, m0);
    _mm512_storeu_ps(v + i, v0);
    _mm512_storeu_ps(m + i + 16, m1);
    _mm512_storeu_ps(v + i + 16, v1);
    mv.store(i, p0, p1, false);
  }
  for (; i < n; ++i) {
    float p = mv.load1(i);
    adamw_elem(s, p, mv.grad1(i), m[i], v[i]);
    mv.store1(i, p);
  }
}

template <MasterFormat F>
void f32_grads(const AdamWScalars& s, const MasterIo& io, float* m, float* v, int64_t n) {
  if (io.g16) f32_fused<F, true>(s, io, m, v, n);
  else f32_fused<F, false>(s, io, m, v, n);
}
}  // namespace

void adamw_f32_avx512_fused(const AdamWScalars& s, MasterFormat f, const MasterIo& io, float* m, float* v,
                            int64_t n) {
  switch (f) {
    case MasterFormat::F32: return f32_grads<MasterFormat::F32>(s, io, m, v, n);
    case MasterFormat::Split: return f32_grads<MasterFormat::Split>(s, io, m, v, n);
    case MasterFormat::Bf16Sr: return f32_grads<MasterFormat::Bf16Sr>(s, io, m, v, n);
  }
}

double sumsq_avx512(const float* g, int64_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(g + i);
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  double acc = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
  for (; i < n; ++i) acc += double(g[i]) * double(g[i]);
  return acc;
}

}  // namespace lt::optim::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
