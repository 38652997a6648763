// The masters' and gradients' storage forms (MasterFormat, core/split_master.h) to and from fp32
// vectors inside the AVX-512 kernels, 32 elements (two vectors) at a time: the same bits as join_master,
// split_master, bf16_to_f32 and round_bf16_sr. Include it after adamw_avx512_common.h (same rules).
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "core/split_master.h"
#include "optim/adamw_kernels.h"

namespace lt::optim::detail {
namespace {

// 64 bytes of 16-bit values with their quadwords reordered 0 4 1 5 2 6 3 7: unpacklo/unpackhi_epi16,
// which work per 128-bit lane, then give elements 0-15 and 16-31 in order.
inline __m512i load_spread(const void* x) {
  return _mm512_permutexvar_epi64(_mm512_set_epi64(7, 3, 6, 2, 5, 1, 4, 0), _mm512_loadu_si512(x));
}

// 32 bf16 -> fp32.
inline void widen32(const bf16_t* x, __m512& a, __m512& b) {
  const __m512i w = load_spread(x), z = _mm512_setzero_si512();
  a = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, w));
  b = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, w));
}

// 32 split masters -> fp32 (join_master for every pair split_master makes). The bits are hi << 16 | lo,
// less 2^16 where the remainder is negative (the high half was rounded up), except for NaN (|hi| above
// inf, i.e. hi + hi > 0xff00 in 16 bits): 32 high halves take the borrow at once.
inline void join32(const bf16_t* hi, const uint16_t* lo, __m512& a, __m512& b) {
  __m512i h = load_spread(hi);
  const __m512i l = load_spread(lo);
  const __mmask32 borrow = _mm512_mask_cmple_epu16_mask(_mm512_movepi16_mask(l), _mm512_add_epi16(h, h),
                                                        _mm512_set1_epi16(int16_t(0xff00)));
  h = _mm512_mask_sub_epi16(h, borrow, h, _mm512_set1_epi16(1));
  a = _mm512_castsi512_ps(_mm512_unpacklo_epi16(l, h));
  b = _mm512_castsi512_ps(_mm512_unpackhi_epi16(l, h));
}

// x's bits + r (r < 2^16) with NaN lanes replaced by x quieted (vfixupimmps as in bf16_rounded). The high
// half is split_master's hi for r = 2^15 and round_bf16_sr's for r = its rounding bits: below inf the
// magnitude plus r never carries into the sign, and inf plus r stays inf.
inline __m512i add_rounding(__m512 x, __m512i r) {
  const __m512i s = _mm512_add_epi32(_mm512_castps_si512(x), r);
  return _mm512_castps_si512(_mm512_fixupimm_ps(_mm512_castsi512_ps(s), x, _mm512_set1_epi32(0x22), 0));
}

// fp32 -> 32 split masters: hi as above, lo = the low half of the bits (the remainder mod 2^16).
template <bool Vbmi>
inline void split32(__m512 a, __m512 b, bf16_t* hi, uint16_t* lo) {
  const __m512i half = _mm512_set1_epi32(0x8000);
  _mm512_storeu_si512(hi, halves<Vbmi, true>(add_rounding(a, half), add_rounding(b, half)));
  _mm512_storeu_si512(lo, halves<Vbmi, false>(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}

// Stochastic rounding's bits for 16 elements: the low 16 bits of sr_bits(key, e), from key + e * golden
// ratio (kg).
inline __m512i sr_bits16(__m512i kg) {
  __m512i h = _mm512_xor_si512(kg, _mm512_srli_epi32(kg, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(int(0x85ebca6bu)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(int(0xc2b2ae35u)));
  return _mm512_ternarylogic_epi32(h, _mm512_srli_epi32(h, 16), _mm512_set1_epi32(0xffff), 0x28);  // (a ^ b) & c
}

// fp32 -> 32 bf16 rounded stochastically: element e0 + k with sr_bits(key, e0 + k).
template <bool Vbmi>
inline void round_sr32(__m512 a, __m512 b, uint32_t key, uint32_t e0, bf16_t* out) {
  const __m512i lanes = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(int(0x9e3779b9u)));
  const __m512i k0 = _mm512_add_epi32(_mm512_set1_epi32(int(key + e0 * 0x9e3779b9u)), lanes);
  const __m512i k1 = _mm512_add_epi32(_mm512_set1_epi32(int(key + (e0 + 16) * 0x9e3779b9u)), lanes);
  _mm512_storeu_si512(out, halves<Vbmi, true>(add_rounding(a, sr_bits16(k0)), add_rounding(b, sr_bits16(k1))));
}

// Where the kernels read and write the masters and gradient of a range, per format: 32 elements at
// element i, or one (tails: the scalar functions).
template <MasterFormat F, bool G16, bool Vbmi>
struct MasterVecs {
  MasterIo io;  // a copy: the kernels' vector stores may alias anything, a reference's fields would be reloaded
  float grad1(int64_t i) const { return G16 ? bf16_to_f32(io.g16[i]) : io.g[i]; }
  float load1(int64_t i) const {
    if constexpr (F == MasterFormat::F32) return io.p[i];
    if constexpr (F == MasterFormat::Split) return join_master(io.bf16[i], io.lo[i]);
    return bf16_to_f32(io.bf16[i]);
  }
  void store1(int64_t i, float p) const {
    if constexpr (F == MasterFormat::F32) {
      io.p[i] = p;
      if (io.bf16) io.bf16[i] = f32_to_bf16(p);
    } else if constexpr (F == MasterFormat::Split) {
      split_master(p, io.bf16 + i, io.lo + i);
    } else {
      io.bf16[i] = round_bf16_sr(p, sr_bits(io.sr_key, io.sr_element0 + uint32_t(i)));
    }
  }
  void grad(int64_t i, __m512& a, __m512& b) const {
    if constexpr (G16) {
      widen32(io.g16 + i, a, b);
    } else {
      a = _mm512_loadu_ps(io.g + i);
      b = _mm512_loadu_ps(io.g + i + 16);
    }
  }
  void load(int64_t i, __m512& a, __m512& b) const {
    if constexpr (F == MasterFormat::F32) {
      a = _mm512_loadu_ps(io.p + i);
      b = _mm512_loadu_ps(io.p + i + 16);
    } else if constexpr (F == MasterFormat::Split) {
      join32(io.bf16 + i, io.lo + i, a, b);
    } else {
      widen32(io.bf16 + i, a, b);
    }
  }
  // F32: the masters and, if wanted, the copy (non-temporal where nt).
  void store(int64_t i, __m512 a, __m512 b, bool nt) const {
    if constexpr (F == MasterFormat::F32) {
      _mm512_storeu_ps(io.p + i, a);
      _mm512_storeu_ps(io.p + i + 16, b);
      if (nt) _mm512_stream_si512(reinterpret_cast<__m512i*>(io.bf16 + i), to_bf16x2<Vbmi>(a, b));
      else if (io.bf16) _mm512_storeu_si512(io.bf16 + i, to_bf16x2<Vbmi>(a, b));
    } else if constexpr (F == MasterFormat::Split) {
      split32<Vbmi>(a, b, io.bf16 + i, io.lo + i);
    } else {
      round_sr32<Vbmi>(a, b, io.sr_key, io.sr_element0 + uint32_t(i), io.bf16 + i);
    }
  }
};

}  // namespace
}  // namespace lt::optim::detail
