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
// between the two levels around |x| / absmax (and 0 for x = +-absmax).
//
// Codes are ordered by magnitude, so quantising is a count of the midpoints ("thresholds") below |y|.
// It is found with a table indexed by the float's exponent and top 8 mantissa bits, each bucket holding
// at most one threshold (checked when the table is built), then one comparison: no search.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

namespace lt::optim {

struct QuantMap {
  bool is_signed = false;
  int mag_bits = 0;                 // 7 (signed) or 8 (unsigned)
  int levels = 0;                   // 2^mag_bits magnitudes, ascending, levels[0] = 0
  float mag[256] = {};              // magnitude of each magnitude index
  float thr[256] = {};              // thr[i] = midpoint of mag[i], mag[i+1]; thr[levels-1] = +inf
  float decode[256] = {};           // code -> value (sign applied for the signed map)
  // Bucket table: index = (bits(|y|) >> kShift) - base, clamped to [0, buckets-1]; lut[index] = the
  // magnitude index of the largest level whose upper threshold is below the bucket start. Stored one
  // byte per bucket with 3 bytes of padding so vector code can gather it with 32-bit loads.
  static constexpr int kShift = 15;  // keep 8 mantissa bits
  int32_t base = 0;
  int32_t buckets = 0;
  std::vector<uint8_t> lut;
};

const QuantMap& signed_dynamic_map();    // for m
const QuantMap& unsigned_dynamic_map();  // for v
// Builds a map (exposed for tests); throws lt::Error if a bucket would hold two thresholds.
QuantMap build_dynamic_map(bool is_signed);

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Nearest code for y (expected in [-1, 1]; beyond that it saturates to the top level).
inline uint8_t quantize_one(const QuantMap& q, float y) {
  uint32_t bits = f32_bits(y);
  uint32_t abits = bits & 0x7fffffffu;
  float a;
  std::memcpy(&a, &abits, 4);
  int32_t idx = int32_t(abits >> QuantMap::kShift) - q.base;
  idx = idx < 0 ? 0 : (idx > q.buckets - 1 ? q.buckets - 1 : idx);
  int32_t lo = q.lut[size_t(idx)];
  int32_t mag = lo + (a > q.thr[lo] ? 1 : 0);
  if (q.is_signed) mag |= int32_t((bits >> 31) << 7);
  return uint8_t(mag);
}
inline float dequantize_one(const QuantMap& q, uint8_t code, float absmax) { return q.decode[code] * absmax; }

// Whole-block helpers (tests, tools): absmax of x[0..n), then codes. Same arithmetic as the kernels.
float quantize_block(const QuantMap& q, const float* x, int64_t n, uint8_t* codes);
void dequantize_block(const QuantMap& q, const uint8_t* codes, int64_t n, float absmax, float* x);

}  // namespace lt::optim
