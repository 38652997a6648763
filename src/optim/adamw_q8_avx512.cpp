// The 8-bit AdamW kernel on AVX-512 with VBMI (Ice Lake, Sapphire Rapids, Zen 4 and later: the
// decoder's byte permutes). Chosen at run time (dispatch.cpp); CPUs with AVX-512 but no VBMI
// (Skylake-X, Cascade Lake) run the AVX2 8-bit kernel (bit-identical to scalar; the moments also equal
// this kernel's, the masters differ within its estimates' error). Shared
// headers come BEFORE the pragma (see adamw_avx512.cpp).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "core/split_master.h"
#include "optim/adamw_elem.h"

#pragma GCC push_options
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 false positive in avx512fintrin.h
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512cd,avx512vbmi,avx2,fma,bmi2")

#include "optim/adamw_avx512_common.h"
#include "optim/adamw_avx512_masters.h"

namespace lt::optim::detail {
namespace {

// The map's decade tables in registers (indexed with lane permutes: no gathers).
template <bool Signed>
struct QV {
  static constexpr int kBits = Signed ? 7 : 8;
  static constexpr int kBinBase = 127 - 31;  // binade index 0 = [2^-31, 2^-30), 31 = [1, 2)
  __m512 inv, off, bnd;
  __m512i ecand_lo, ecand_hi;
  explicit QV(const QuantMap& q) {
    // Quantiser tables: 8 entries in the low lanes, indexed by decade.
    inv = _mm512_zextps256_ps512(_mm256_loadu_ps(q.inv_step));
    off = _mm512_zextps256_ps512(_mm256_loadu_ps(q.code_off));
    // bnd[e] = the decade top just above decade e's values (+inf above decade 0).
    alignas(64) float b[16] = {};
    b[0] = INFINITY;
    for (int t = 1; t < kBits; ++t) b[t] = q.top[t];
    bnd = _mm512_load_ps(b);
    // Decade of each binade's lower end 2^k; a binade holds at most one decade top (they are a factor
    // 10 apart), so the decade of a is ecand[k] or one less: ecand[k] = #{t : 2^k < top[t]}.
    alignas(64) int32_t ec[32];
    for (int k = 0; k < 32; ++k) {
      float lo = std::ldexp(1.0f, k + kBinBase - 127);
      int e = 0;
      for (int t = 1; t < kBits; ++t) e += lo < q.top[t] ? 1 : 0;
      ec[k] = e;
    }
    ecand_lo = _mm512_load_si512(ec);
    ecand_hi = _mm512_load_si512(ec + 16);
  }
};

// Nearest code of 16 values y, as int32 lanes: the same result as quantize_one (its decade count
// #{t : a < top[t]} is found here from the binade's decade and one comparison). The bottom decade's
// line does what a zero test did (quant8.h): signed, round(|y| / level 1) is 0 or 1; unsigned, always
// 1, and min(code, bits of |y|) leaves an exact 0 at 0 (the bits of any |y| > 0 are >= 1, and >= 2^24
// for every |y| above the bottom decade).
template <bool Signed>
inline __m512i quant16(const QV<Signed>& q, __m512 y) {
  __m512i bits = _mm512_castps_si512(y);
  // v >= +0 always (a square's moving average), so the unsigned map needs no absolute value.
  __m512i abits = Signed ? _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)) : bits;
  __m512 a = _mm512_castsi512_ps(abits);
  // Binade = exponent field, clamped below at 2^-31 (kBinBase: all of it in the bottom decade); the
  // permute reads its low 5 bits (kBinBase = 96 -> 0, exponent 127 -> 31; |y| <= 1 + rounding never
  // goes above).
  __m512i bin = _mm512_max_epu32(_mm512_srli_epi32(abits, 23), _mm512_set1_epi32(QV<Signed>::kBinBase));
  __m512i e = _mm512_permutex2var_epi32(q.ecand_lo, bin, q.ecand_hi);
  __mmask16 up = _mm512_cmp_ps_mask(a, _mm512_permutexvar_ps(e, q.bnd), _CMP_GE_OQ);
  e = _mm512_mask_sub_epi32(e, up, e, _mm512_set1_epi32(1));
  __m512 cf = _mm512_fmadd_ps(a, _mm512_permutexvar_ps(e, q.inv), _mm512_permutexvar_ps(e, q.off));
  __m512i code = _mm512_cvtps_epi32(cf);
  if (Signed)  // sign bit 31 of y -> bit 7 of the code
    return _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80), 0xF8);
  return _mm512_min_epu32(code, abits);
}

// The dword permutation that transposes 4x4 blocks of 4-byte groups (its own inverse): it maps the
// lane order of the unpack/pack instruction sequences below to element order.
inline __m512i transpose4x4_idx() { return _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0); }

// 64 codes of 4 x 16 int32 lanes (values 0..255), in element order -> 64 bytes.
inline __m512i pack64(__m512i c0, __m512i c1, __m512i c2, __m512i c3) {
  __m512i w01 = _mm512_packus_epi32(c0, c1), w23 = _mm512_packus_epi32(c2, c3);
  return _mm512_permutexvar_epi32(transpose4x4_idx(), _mm512_packus_epi16(w01, w23));
}

// Prefetch distances in blocks: into L1 kPrefetchBlocks ahead, and into L2 kPrefetchL2Blocks further
// (see the kernel).
constexpr int64_t kPrefetchBlocks = 4;
constexpr int64_t kPrefetchL2Blocks = 16;

// One or two (Lines) consecutive cache lines of an array of ElemBytes-byte elements into L1, and the
// same lines kPrefetchL2Blocks blocks further into L2. Not a loop: GCC 12 deletes loops of prefetches.
template <int64_t ElemBytes, int Lines = 2>
inline void prefetch_lines(const void* a) {
  static_assert(Lines == 1 || Lines == 2);
  constexpr int64_t far = kPrefetchL2Blocks * kQ8Block * ElemBytes;
  const char* c = static_cast<const char*>(a);
  _mm_prefetch(c, _MM_HINT_T0);
  if constexpr (Lines == 2) _mm_prefetch(c + 64, _MM_HINT_T0);
  _mm_prefetch(c + far, _MM_HINT_T1);
  if constexpr (Lines == 2) _mm_prefetch(c + far + 64, _MM_HINT_T1);
}

// Codes of a block's kQ8Block values x * inv (x 64-byte aligned); also prefetches the kQ8Block bytes at
// `ahead` (a later block's codes) when not null, one line per 64 codes.
template <bool Signed>
inline void quant_block(const QV<Signed>& q, const float* x, __m512 inv, uint8_t* codes, const uint8_t* ahead) {
  for (int64_t i = 0; i < kQ8Block; i += 64) {
    if (ahead) {
      _mm_prefetch(reinterpret_cast<const char*>(ahead + i), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(ahead + i + kPrefetchL2Blocks * kQ8Block), _MM_HINT_T1);
    }
    __m512i c[4];
    for (int k = 0; k < 4; ++k) c[k] = quant16(q, _mm512_mul_ps(_mm512_load_ps(x + i + 16 * k), inv));
    _mm512_storeu_si512(codes + i, pack64(c[0], c[1], c[2], c[3]));
  }
}

// Byte-plane decode tables (AVX-512 VBMI): byte k of the fp32 bits of decode[c], for each code c.
// The signed map decodes c & 0x7f through 128-entry planes and takes the sign from bit 7.
template <bool Signed>
struct DecodePlanes {
  static constexpr int kEntries = Signed ? 128 : 256;
  __m512i plane[4][kEntries / 64];
  explicit DecodePlanes(const QuantMap& q) {
    alignas(64) uint8_t b[4][256];
    for (int c = 0; c < kEntries; ++c) {
      uint32_t u;
      std::memcpy(&u, &q.decode[c], 4);
      for (int k = 0; k < 4; ++k) b[k][c] = uint8_t(u >> (8 * k));
    }
    for (int k = 0; k < 4; ++k)
      for (int h = 0; h < kEntries / 64; ++h) plane[k][h] = _mm512_load_si512(b[k] + 64 * h);
  }
};

// The unsigned map (v) decoded arithmetically, as the map defines its levels: code c of decade e
// (c in [n_e, 2 n_e), e = lzcnt(c) - 24) is fma(step_e, c, base_e). Two 16-entry tables indexed by
// lzcnt & 15 (entry 0, for c = 0 and lzcnt 32, is 0). Cheaper than the byte planes here: its 256
// entries need two 2-uop vpermt2b and a blend per plane.
struct DecodeLines {
  __m512 base, step;
  explicit DecodeLines(const QuantMap& q) {
    alignas(64) float b[16] = {}, st[16] = {};
    for (int e = 0; e < q.mag_bits; ++e) b[8 + e] = q.base[e], st[8 + e] = q.step[e];
    base = _mm512_load_ps(b);
    step = _mm512_load_ps(st);
  }
};

// 64 codes of the unsigned map -> 64 values * scale (64-byte aligned out); bit-identical to
// QuantMap::decode[c] * scale (the table is built with the same fma).
inline void dequant64_lines(const DecodeLines& t, const uint8_t* codes, __m512 scale, float* out) {
  for (int k = 0; k < 4; ++k) {
    __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * k)));
    __m512i lz = _mm512_lzcnt_epi32(c);
    __m512 mag = _mm512_fmadd_ps(_mm512_permutexvar_ps(lz, t.step), _mm512_cvtepi32_ps(c),
                                 _mm512_permutexvar_ps(lz, t.base));
    _mm512_store_ps(out + 16 * k, _mm512_mul_ps(mag, scale));
  }
}

// 64 codes -> their 64 levels (64-byte aligned out), in element order; bit-identical to QuantMap::decode[c].
template <bool Signed>
inline void dequant64(const DecodePlanes<Signed>& t, const uint8_t* codes, float* out) {
  // Pre-permute the codes so that the unpack sequence below leaves the values in element order.
  __m512i c = _mm512_permutexvar_epi32(transpose4x4_idx(), _mm512_loadu_si512(codes));
  __m512i pl[4];
  if (Signed) {  // vpermi2b reads the low 7 index bits: c & 0x7f
    for (int k = 0; k < 4; ++k) pl[k] = _mm512_permutex2var_epi8(t.plane[k][0], c, t.plane[k][1]);
    pl[3] = _mm512_ternarylogic_epi32(pl[3], c, _mm512_set1_epi8(int8_t(0x80)), 0xF8);  // | (c & 0x80)
  } else {
    __mmask64 hi = _mm512_movepi8_mask(c);
    for (int k = 0; k < 4; ++k)
      pl[k] = _mm512_mask_blend_epi8(hi, _mm512_permutex2var_epi8(t.plane[k][0], c, t.plane[k][1]),
                                     _mm512_permutex2var_epi8(t.plane[k][2], c, t.plane[k][3]));
  }
  __m512i lo01 = _mm512_unpacklo_epi8(pl[0], pl[1]), hi01 = _mm512_unpackhi_epi8(pl[0], pl[1]);
  __m512i lo23 = _mm512_unpacklo_epi8(pl[2], pl[3]), hi23 = _mm512_unpackhi_epi8(pl[2], pl[3]);
  _mm512_store_si512(out, _mm512_unpacklo_epi16(lo01, lo23));
  _mm512_store_si512(out + 16, _mm512_unpackhi_epi16(lo01, lo23));
  _mm512_store_si512(out + 32, _mm512_unpacklo_epi16(hi01, hi23));
  _mm512_store_si512(out + 48, _mm512_unpackhi_epi16(hi01, hi23));
}

}  // namespace

// Software prefetch kPrefetchBlocks blocks ahead into L1, spread over all of the block's passes (see the
// kernel), plus the same lines kPrefetchL2Blocks blocks further into L2: a block is ~0.2 us of
// arithmetic per core, and the hardware prefetchers alone left part of the misses exposed (12-15 %
// slower without any software prefetch). The L2 prefetches took the 2-thread update from 1.00-1.05 to
// 0.97-0.98 ns/param/thread (alternating runs; 32 or 64 blocks were no better). Issuing all 40 lines at
// the block start gained nothing (fill buffers full); 2 to 16 blocks ahead for the L1 prefetch measured
// the same.
constexpr int64_t kPrefetchAhead = kPrefetchBlocks * kQ8Block;

namespace {
// The partial last block (len < kQ8Block): the scalar kernel (identical arithmetic) over fp32 scratch.
template <MasterFormat F, bool G16>
void q8_partial(const AdamWScalars& s, const MasterVecs<F, G16, true>& mv, int64_t b0, uint8_t* mq, uint8_t* vq,
                float* ms, float* vs, int64_t len) {
  alignas(64) float p[kQ8Block], g[kQ8Block];
  for (int64_t i = 0; i < len; ++i) p[i] = mv.load1(b0 + i), g[i] = mv.grad1(b0 + i);
  adamw_q8_scalar(s, p, g, mq + b0, vq + b0, ms, vs, nullptr, len);
  for (int64_t i = 0; i < len; ++i) mv.store1(b0 + i, p[i]);
}

// F: the masters' storage (MasterVecs); G16: bf16 gradients.
template <bool Scaled, MasterFormat F, bool G16>
void q8_kernel(const AdamWScalars& s, const MasterIo& io, uint8_t* mq, uint8_t* vq, float* ms, float* vs,
               int64_t n) {
  static const QV<true> qm(signed_dynamic_map());
  static const QV<false> qv(unsigned_dynamic_map());
  static const DecodePlanes<true> dm(signed_dynamic_map());
  static const DecodeLines dv(unsigned_dynamic_map());
  const V c(s);
  const MasterVecs<F, G16, true> mv{io};
  alignas(64) float tm[kQ8Block], tv[kQ8Block];
  // The bf16 copy of F32 masters is only written here (the GPU upload reads it later): non-temporal
  // stores skip the read-for-ownership of its lines (measured: 8-bit update 77-89 % -> 94 % of bandwidth
  // on 16 cores together with the prefetch). They need 64-byte alignment, which pinned buffers have.
  // (Split and Bf16Sr masters are read first: their lines are in cache.)
  const bool nt = F == MasterFormat::F32 && io.bf16 && reinterpret_cast<uintptr_t>(io.bf16) % 64 == 0;
  constexpr int64_t kGradBytes = G16 ? 2 : 4;
  const char* gbytes = G16 ? reinterpret_cast<const char*>(io.g16) : reinterpret_cast<const char*>(io.g);
  for (int64_t b0 = 0, blk = 0; b0 < n; b0 += kQ8Block, ++blk) {
    int64_t len = std::min<int64_t>(kQ8Block, n - b0);
    if (len < kQ8Block) {
      q8_partial<F, G16>(s, mv, b0, mq, vq, ms + blk, vs + blk, len);
      break;
    }
    // The block kPrefetchBlocks ahead: its lines are requested evenly over all five passes (the
    // masters' in the two decode passes, g's in the update, the codes in the requantisation), so that
    // misses stay in flight while the core computes instead of bunching in the update pass.
    const bool pf = b0 + kPrefetchAhead + kQ8Block <= n;
    const int64_t ahead = b0 + kPrefetchAhead;
    // The blocks' scales enter as factors of beta1 and beta2 (adamw_kernels.h): m is decoded unscaled,
    // v times beta2 * its scale.
    const __m512 b1s = _mm512_set1_ps(s.beta1 * ms[blk]), b2s = _mm512_set1_ps(s.beta2 * vs[blk]);
    // Three passes over the block through L1-resident temporaries, each with few live constants (one
    // fused loop kept ~45 vector constants live and spilled them on every iteration).
    for (int64_t i = 0; i < kQ8Block; i += 64) {  // i / 2 elements: the first half of an fp32 array's lines
      if (pf && F == MasterFormat::F32) prefetch_lines<4>(io.p + ahead + i / 2);
      if (pf && F != MasterFormat::F32) prefetch_lines<2>(io.bf16 + ahead + i);
      dequant64(dm, mq + b0 + i, tm + i);
    }
    for (int64_t i = 0; i < kQ8Block; i += 64) {
      if (pf && F == MasterFormat::F32) prefetch_lines<4>(io.p + ahead + kQ8Block / 2 + i / 2);
      if (pf && F == MasterFormat::Split) prefetch_lines<2>(io.lo + ahead + i);
      dequant64_lines(dv, vq + b0 + i, b2s, tv + i);
    }
    __m512 am = _mm512_setzero_ps(), av = _mm512_setzero_ps();
    // The update: stage A (moments, denominator) of the next vector pair runs ahead of stage B (step,
    // master, bf16 copy) of this one (adamw_avx512_common.h).
    auto stage_a = [&](int64_t i) {
      __m512 g0, g1;
      mv.grad(b0 + i, g0, g1);
      return std::pair{q8_stage_a<Scaled>(c, b1s, g0, _mm512_load_ps(tm + i), _mm512_load_ps(tv + i)),
                       q8_stage_a<Scaled>(c, b1s, g1, _mm512_load_ps(tm + i + 16), _mm512_load_ps(tv + i + 16))};
    };
    auto [a0, a1] = stage_a(0);
    for (int64_t i = 0; i < kQ8Block; i += 32) {
      if (pf) prefetch_lines<kGradBytes, int(kGradBytes / 2)>(gbytes + (ahead + i) * kGradBytes);  // 32 of g
      Q8Moments n0 = a0, n1 = a1;
      if (i + 32 < kQ8Block) std::tie(n0, n1) = stage_a(i + 32);
      __m512 p0, p1;
      mv.load(b0 + i, p0, p1);
      p0 = q8_stage_b(c, p0, a0);
      p1 = q8_stage_b(c, p1, a1);
      mv.store(b0 + i, p0, p1, nt);
      _mm512_store_ps(tm + i, a0.m);
      _mm512_store_ps(tm + i + 16, a1.m);
      _mm512_store_ps(tv + i, a0.v);
      _mm512_store_ps(tv + i + 16, a1.v);
      am = _mm512_range_ps(am, _mm512_range_ps(a0.m, a1.m, 0x0B), 0x0B);  // max of |.|, sign cleared
      av = _mm512_max_ps(av, _mm512_max_ps(a0.v, a1.v));
      a0 = n0, a1 = n1;
    }
    float amax = _mm512_reduce_max_ps(am), vmax = _mm512_reduce_max_ps(av);
    ms[blk] = amax;
    vs[blk] = vmax;
    const __m512 im = _mm512_set1_ps(block_inv(amax)), iv = _mm512_set1_ps(block_inv(vmax));
    quant_block(qm, tm, im, mq + b0, pf ? mq + ahead : nullptr);
    quant_block(qv, tv, iv, vq + b0, pf ? vq + ahead : nullptr);
  }
  if (nt) _mm_sfence();
}

template <MasterFormat F, bool G16>
void q8_scaled(const AdamWScalars& s, const MasterIo& io, uint8_t* mq, uint8_t* vq, float* ms, float* vs, int64_t n) {
  if (s.grad_scale == 1.0f) q8_kernel<false, F, G16>(s, io, mq, vq, ms, vs, n);
  else q8_kernel<true, F, G16>(s, io, mq, vq, ms, vs, n);
}

template <MasterFormat F>
void q8_grads(const AdamWScalars& s, const MasterIo& io, uint8_t* mq, uint8_t* vq, float* ms, float* vs, int64_t n) {
  if (io.g16) q8_scaled<F, true>(s, io, mq, vq, ms, vs, n);
  else q8_scaled<F, false>(s, io, mq, vq, ms, vs, n);
}
}  // namespace

void adamw_q8_avx512(const AdamWScalars& s, float* p, const float* g, uint8_t* mq, uint8_t* vq, float* ms,
                     float* vs, bf16_t* out, int64_t n) {
  MasterIo io;
  io.p = p, io.bf16 = out, io.g = g;
  q8_scaled<MasterFormat::F32, false>(s, io, mq, vq, ms, vs, n);
}

void adamw_q8_avx512_fused(const AdamWScalars& s, MasterFormat f, const MasterIo& io, uint8_t* mq, uint8_t* vq,
                           float* ms, float* vs, int64_t n) {
  switch (f) {
    case MasterFormat::F32: return q8_grads<MasterFormat::F32>(s, io, mq, vq, ms, vs, n);
    case MasterFormat::Split: return q8_grads<MasterFormat::Split>(s, io, mq, vq, ms, vs, n);
    case MasterFormat::Bf16Sr: return q8_grads<MasterFormat::Bf16Sr>(s, io, mq, vq, ms, vs, n);
  }
}

}  // namespace lt::optim::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
