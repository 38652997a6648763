#include "optim/master_tiles.h"

#include "core/split_master.h"

#include <immintrin.h>

// Each loop has an AVX2 body of 8 elements (the same integer operations as the scalar functions of
// core/split_master.h, hence the same bits) and the scalar function for the tail and for older CPUs.
// Written with intrinsics: GCC does not vectorise the 16 <-> 32-bit mixes on its own. On AVX-512 with
// VBMI the update kernels read and write these forms themselves (adamw_avx512_masters.h), so these
// loops serve the other paths, checkpoints and initialisation.
namespace lt::optim {
namespace {

bool kAvx2 = __builtin_cpu_supports("avx2");
__attribute__((target("avx2"))) inline __m256i load8_u16(const uint16_t* p) {
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
__attribute__((target("avx2"))) inline __m256i load8_i16(const uint16_t* p) {
  return _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// 8 lanes holding values < 2^16 -> 8 x uint16.
__attribute__((target("avx2"))) inline void store8_u16(uint16_t* p, __m256i v) {
  const __m256i packed = _mm256_packus_epi32(v, v);  // per 128-bit lane: 4 values twice
  const __m256i ordered = _mm256_permute4x64_epi64(packed, 0x08);  // lanes 0 and 2 -> the low 128 bits
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(ordered));
}

__attribute__((target("avx2"))) int64_t join_avx2(const bf16_t* hi, const uint16_t* lo, float* p, int64_t n) {
  const __m256i k7fff = _mm256_set1_epi32(0x7fff), k8000 = _mm256_set1_epi32(0x8000), kInf = _mm256_set1_epi32(0x7f80);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i h16 = load8_u16(hi + i), l = load8_i16(lo + i), lu = load8_u16(lo + i);
    const __m256i h = _mm256_and_si256(h16, k7fff);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h16, k8000), 16);
    const __m256i mag = _mm256_add_epi32(_mm256_slli_epi32(h, 16), l);
    const __m256i nan_bits = _mm256_or_si256(_mm256_slli_epi32(h16, 16), lu);
    const __m256i nan = _mm256_cmpgt_epi32(h, kInf);
    const __m256i r = _mm256_blendv_epi8(_mm256_or_si256(sign, mag), nan_bits, nan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + i), r);
  }
  return i;
}

__attribute__((target("avx2"))) int64_t split_avx2(const float* p, bf16_t* hi, uint16_t* lo, int64_t n) {
  const __m256i kMag = _mm256_set1_epi32(0x7fffffff), kHalf = _mm256_set1_epi32(0x8000),
                kInf = _mm256_set1_epi32(0x7f800000), kQuiet = _mm256_set1_epi32(0x40),
                kLow = _mm256_set1_epi32(0xffff);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
    const __m256i mag = _mm256_and_si256(u, kMag);
    const __m256i h = _mm256_srli_epi32(_mm256_add_epi32(mag, kHalf), 16);
    const __m256i sign16 = _mm256_srli_epi32(_mm256_andnot_si256(kMag, u), 16);
    const __m256i nan = _mm256_cmpgt_epi32(mag, kInf);
    const __m256i hv = _mm256_blendv_epi8(_mm256_or_si256(sign16, h),
                                          _mm256_or_si256(_mm256_srli_epi32(u, 16), kQuiet), nan);
    const __m256i lv = _mm256_and_si256(_mm256_blendv_epi8(_mm256_sub_epi32(mag, _mm256_slli_epi32(h, 16)), u, nan), kLow);
    store8_u16(hi + i, hv);
    store8_u16(lo + i, lv);
  }
  return i;
}

__attribute__((target("avx2"))) int64_t widen_avx2(const bf16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(load8_u16(in + i), 16));
  return i;
}

__attribute__((target("avx2"))) int64_t round_sr_avx2(const float* p, bf16_t* out, int64_t n, uint32_t key,
                                                       uint32_t element0) {
  const __m256i kMag = _mm256_set1_epi32(0x7fffffff), kInf = _mm256_set1_epi32(0x7f800000),
                kLow = _mm256_set1_epi32(0xffff), kQuiet = _mm256_set1_epi32(0x40);
  const __m256i golden = _mm256_set1_epi32(int(0x9e3779b9u)), m1 = _mm256_set1_epi32(int(0x85ebca6bu)),
                m2 = _mm256_set1_epi32(int(0xc2b2ae35u)), step8 = _mm256_set1_epi32(8);
  __m256i e = _mm256_add_epi32(_mm256_set1_epi32(int(element0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i vkey = _mm256_set1_epi32(int(key));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8, e = _mm256_add_epi32(e, step8)) {
    __m256i h = _mm256_add_epi32(vkey, _mm256_mullo_epi32(e, golden));  // sr_bits
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    h = _mm256_mullo_epi32(h, m1);
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
    h = _mm256_mullo_epi32(h, m2);
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
    const __m256i mag = _mm256_and_si256(u, kMag);
    const __m256i sign16 = _mm256_srli_epi32(_mm256_andnot_si256(kMag, u), 16);
    const __m256i m = _mm256_srli_epi32(_mm256_add_epi32(mag, _mm256_and_si256(h, kLow)), 16);
    // inf and NaN as round-to-nearest: the high half, NaN quieted.
    const __m256i special = _mm256_cmpgt_epi32(mag, _mm256_sub_epi32(kInf, _mm256_set1_epi32(1)));
    const __m256i nan = _mm256_cmpgt_epi32(mag, kInf);
    const __m256i sv = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_and_si256(nan, kQuiet));
    store8_u16(out + i, _mm256_blendv_epi8(_mm256_or_si256(sign16, m), sv, special));
  }
  return i;
}

}  // namespace

void limit_tile_isa(Isa isa) {
  kAvx2 = __builtin_cpu_supports("avx2") && (isa == Isa::Auto || isa == Isa::Avx2 || isa == Isa::Avx512);
}

void join_tile(const bf16_t* hi, const uint16_t* lo, float* p, int64_t n) {
  const int64_t v = kAvx2 ? join_avx2(hi, lo, p, n) : 0;
  for (int64_t i = v; i < n; ++i) p[i] = join_master(hi[i], lo[i]);
}

void split_tile(const float* p, bf16_t* hi, uint16_t* lo, int64_t n) {
  const int64_t v = kAvx2 ? split_avx2(p, hi, lo, n) : 0;
  for (int64_t i = v; i < n; ++i) split_master(p[i], hi + i, lo + i);
}

void widen_tile(const bf16_t* in, float* out, int64_t n) {
  const int64_t v = kAvx2 ? widen_avx2(in, out, n) : 0;
  for (int64_t i = v; i < n; ++i) out[i] = bf16_to_f32(in[i]);
}

void round_tile_sr(const float* p, bf16_t* out, int64_t n, uint32_t key, uint32_t element0) {
  const int64_t v = kAvx2 ? round_sr_avx2(p, out, n, key, element0) : 0;
  for (int64_t i = v; i < n; ++i)
    out[i] = round_bf16_sr(p[i], sr_bits(key, element0 + uint32_t(i)));
}

}  // namespace lt::optim

