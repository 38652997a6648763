// AVX2 helpers for hot loops over the vocabulary (cross-entropy). glibc's expf is not vectorised
// without -ffast-math, and -O2 with trapping math does not if-convert clamps, so the kernels are
// written with intrinsics (lt_backend is compiled with -march=x86-64-v3). exp: Cephes-style,
// exp(x) = 2^k * exp(r), r = x - k ln2, |r| <= ln2/2, < 2 ulp over the clamped range [-87, 88].
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace lt::cpu::vec {

// Usable from translation units compiled without -mavx2 (the tests): the target attribute enables AVX2
// for these functions only. Callers must run on an AVX2+FMA CPU (x86-64-v3, as lt_backend assumes).
#define LT_AVX2 __attribute__((target("avx2,fma")))

LT_AVX2 inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fmadd_ps(k, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

LT_AVX2 inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// max of z[0..n)
LT_AVX2 inline float row_max(const float* z, int64_t n) {
  __m256 m = _mm256_set1_ps(-__builtin_inff());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(z + i));
  float s = hmax8(m);
  for (; i < n; ++i) s = z[i] > s ? z[i] : s;
  return s;
}

// sum of exp(z[i] - shift), accumulated in double.
LT_AVX2 inline double sum_exp(const float* z, int64_t n, float shift) {
  const __m256 sh = _mm256_set1_ps(shift);
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(z + i), sh));
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double t[4];
  _mm256_store_pd(t, _mm256_add_pd(a0, a1));
  double s = (t[0] + t[1]) + (t[2] + t[3]);
  for (; i < n; ++i) {
    alignas(32) float in[8] = {z[i] - shift, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f}, out[8];
    _mm256_store_ps(out, exp8(_mm256_load_ps(in)));
    s += double(out[0]);
  }
  return s;
}

// z[i] = exp(z[i] - shift) * scale, in place.
LT_AVX2 inline void exp_scale_inplace(float* z, int64_t n, float shift, float scale) {
  const __m256 sh = _mm256_set1_ps(shift), sc = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(z + i, _mm256_mul_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(z + i), sh)), sc));
  for (; i < n; ++i) {
    alignas(32) float in[8] = {z[i] - shift, 0, 0, 0, 0, 0, 0, 0}, out[8];
    _mm256_store_ps(out, exp8(_mm256_load_ps(in)));
    z[i] = out[0] * scale;
  }
}

LT_AVX2 inline __m256 sigmoid8(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
}

// act[i] = silu(gate[i]) * up[i] for i in [0, n); n % 8 tail handled with a masked copy.
LT_AVX2 inline void swiglu_fwd8(const float* gate, const float* up, int64_t n, float* act) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    _mm256_storeu_ps(act + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid8(g)), _mm256_loadu_ps(up + i)));
  }
  if (i < n) {
    alignas(32) float gb[8] = {}, ub[8] = {}, ab[8];
    for (int64_t j = i; j < n; ++j) gb[j - i] = gate[j], ub[j - i] = up[j];
    swiglu_fwd8(gb, ub, 8, ab);
    for (int64_t j = i; j < n; ++j) act[j] = ab[j - i];
  }
}

// silu(g) = g s, silu'(g) = s (1 + g (1 - s)), s = sigmoid(g): dgate = dact * up * silu'(g), dup = dact * silu(g).
LT_AVX2 inline void swiglu_bwd8(const float* gate, const float* up, const float* dact, int64_t n, float* dgate,
                                float* dup) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i), s = sigmoid8(g), da = _mm256_loadu_ps(dact + i);
    const __m256 u = _mm256_loadu_ps(up + i);
    const __m256 dsilu = _mm256_mul_ps(s, _mm256_add_ps(one, _mm256_mul_ps(g, _mm256_sub_ps(one, s))));
    _mm256_storeu_ps(dup + i, _mm256_mul_ps(da, _mm256_mul_ps(g, s)));
    _mm256_storeu_ps(dgate + i, _mm256_mul_ps(_mm256_mul_ps(da, u), dsilu));
  }
  if (i < n) {
    alignas(32) float gb[8] = {}, ub[8] = {}, db[8] = {}, o1[8], o2[8];
    for (int64_t j = i; j < n; ++j) gb[j - i] = gate[j], ub[j - i] = up[j], db[j - i] = dact[j];
    swiglu_bwd8(gb, ub, db, 8, o1, o2);
    for (int64_t j = i; j < n; ++j) dgate[j] = o1[j - i], dup[j] = o2[j - i];
  }
}

}  // namespace lt::cpu::vec
