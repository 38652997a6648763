// 8-bit blockwise dynamic quantisation of optimizer moments (the "dynamic tree" map of the 8-bit
// optimizers paper, Dettmers et al. 2022, implemented from its description).
//
// A code's bits read, from the top: [sign bit, signed map only] then E zero bits, one indicator 1-bit,
// and the remaining R bits as a linear fraction. Its magnitude is 10^-E * (0.1 + 0.9 * (k+1) / 2^R),
// k the R-bit fraction (0..2^R-1); all-zero magnitude bits mean 0. So each decade 10^-E has 2^R
// levels, fine near 1 and coarse (but relative) far below it; the top level is exactly 1.0, so a
// block's absmax element is stored exactly. The signed map (first moment m) has 7 magnitude bits
// (levels down to 1e-6), the unsigned one (second moment v >= 0) 8 (down to 1e-7).
//
// A block of kQ8Block values x is stored as absmax = max|x| (fp32) and, per value, the code whose level
// is NEAREST to x / absmax. Error bound per value: |x - dequant| <= absmax * gap / 2, gap the distance
// between the two levels around |x| / absmax (and 0 for x = +-absmax); for the unsigned map, values
// below the smallest level L round up to it: error < absmax * L.
//
// Quantising is arithmetic, not a search or a table gather (gathers are slow on many x86 CPUs). Within
// decade e the levels are evenly spaced on a line: level(c) = base_e + step_e * c for its codes c in
// [n_e, 2 n_e), and the same line continued one step down gives decade e+1's top level 10^-(e+1) at
// c = n_e - 1 (up to a few ulps, which the rounding absorbs). So for |y| in [10^-(e+1), 10^-e) the
// nearest code is round(fma(|y|, 1 / step_e, -base_e / step_e)), always a valid code of decade e or the
// top of e+1, with no clamping. The decade is the count
// of decade tops above |y|. The bottom decade (one code, 10^-(bits-1)) has its own line: nearest of 0 and
// that level for the signed map (code = round(|y| / level)), always that level for the unsigned one (code
// 1; only an exact 0 stays 0). Nearest up to float rounding when |y| is within ~1e-5 of a spacing of a
// midpoint. A level is DEFINED as the float fma(step_e, c, base_e) (base_e itself the float
// fma(-step_e, 2 n_e - 1, 10^-e)): one fused operation that every path evaluates alike, so all decode
// bit-identically, and every decade's top, 1 included, comes out exact (build_dynamic_map checks it).
// Second moment: a positive v never rounds to 0, only to the smallest level. A v stored as 0 next to a
// non-zero m makes m / sqrt(v) explode for that element in later steps (the "zero-point problem" of
// quantised second moments, Li et al. 2023). The one exception is a whole block below FLT_MIN
// (block_inv): there sqrt(v) < 1.1e-19 is far below eps, so 0 changes no step.
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>

namespace lt::optim {

struct QuantMap {
  bool is_signed = false;
  int mag_bits = 0;                 // 7 (signed) or 8 (unsigned)
  int levels = 0;                   // 2^mag_bits magnitudes, ascending, mag[0] = 0
  float mag[256] = {};              // magnitude of each magnitude code
  float decode[256] = {};           // code -> value (sign applied for the signed map; 0x80 is -0)
  // Decade e (0 .. mag_bits-1) holds codes [n_e, 2 n_e), n_e = 2^(mag_bits-1-e); code c's magnitude is
  // fma(step[e], c, base[e]).
  float top[8] = {};                // 10^-e
  float step[8] = {};               // 0.9 * 10^-e / n_e
  float base[8] = {};               // the line's value at c = 0: fma(-step, 2 n_e - 1, top)
  // The quantiser's line per decade: code = round(fma(|y|, inv_step[e], code_off[e])). Bottom decade:
  // signed 1 / level(1) and 0 (nearest of 0 and level 1), unsigned 0 and 1 (always code 1).
  float inv_step[8] = {};
  float code_off[8] = {};
};

const QuantMap& signed_dynamic_map();    // for m
const QuantMap& unsigned_dynamic_map();  // for v
// Builds a map (exposed for tests); throws lt::Error if the levels are not strictly increasing.
QuantMap build_dynamic_map(bool is_signed);

// Nearest code for y (expected in [-1, 1] up to rounding). The vector kernels perform exactly these
// operations.
inline uint8_t quantize_one(const QuantMap& q, float y) {
  uint32_t bits;
  std::memcpy(&bits, &y, 4);
  uint32_t abits = bits & 0x7fffffffu;
  float a;
  std::memcpy(&a, &abits, 4);
  int e = 0;
  for (int t = 1; t < q.mag_bits; ++t) e += a < q.top[t] ? 1 : 0;
  float cf = std::fma(a, q.inv_step[e], q.code_off[e]);
  // A non-finite y (an infinite moment times block_inv's 0 is NaN) gets code 0, which is what the
  // vector paths' saturating packs make of it; converting NaN or inf to int is undefined in C++.
  if (!(cf > -1.0f && cf < 256.0f)) return 0;
  // Round to nearest even without a libm call: adding 1.5 * 2^23 leaves the rounded integer in the
  // low mantissa bits (exact for |cf| < 2^22), as cvtps2dq does in the vector paths.
  constexpr float kRound = 12582912.0f;
  int32_t code = int32_t((cf + kRound) - kRound);
  if (q.is_signed) code |= int32_t((bits >> 31) << 7);
  else if (a == 0.0f) code = 0;  // the unsigned bottom line gives 1 for everything else below 10^-7
  return uint8_t(code);
}
inline float dequantize_one(const QuantMap& q, uint8_t code, float absmax) { return q.decode[code] * absmax; }

// The factor a block's values are quantised with: 1 / absmax. A block whose absmax is below FLT_MIN
// (1 / absmax would overflow), +inf or NaN gets 0, so all its codes are 0: a second moment that small has
// sqrt(v) < 1.1e-19, far below any eps, and a first moment that small moves nothing. Every path uses it.
inline float block_inv(float absmax) {
  return absmax >= std::numeric_limits<float>::min() ? 1.0f / absmax : 0.0f;
}

// Whole-block helpers (tests, tools): absmax of x[0..n), then codes. Same arithmetic as the kernels.
float quantize_block(const QuantMap& q, const float* x, int64_t n, uint8_t* codes);
void dequantize_block(const QuantMap& q, const uint8_t* codes, int64_t n, float absmax, float* x);

}  // namespace lt::optim
