#include "optim/quant8.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace lt::optim {

QuantMap build_dynamic_map(bool is_signed) {
  QuantMap q;
  q.is_signed = is_signed;
  q.mag_bits = is_signed ? 7 : 8;
  q.levels = 1 << q.mag_bits;
  // Magnitude bit patterns: E leading zeros, indicator bit, R = mag_bits-1-E fraction bits. The code's
  // integer value orders exactly like the magnitude (more leading zeros = smaller decade), so the
  // magnitude index IS the code's magnitude bits.
  q.mag[0] = 0.0f;
  for (int code = 1; code < q.levels; ++code) {
    int top = 31 - __builtin_clz(unsigned(code));  // position of the indicator bit
    int e = q.mag_bits - 1 - top;                  // leading zeros
    int r = top;                                   // fraction bits below the indicator
    int k = code & ((1 << r) - 1);
    double frac = 0.1 + 0.9 * double(k + 1) / double(1 << r);
    q.mag[code] = float(std::pow(10.0, -e) * frac);
  }
  for (int i = 1; i < q.levels; ++i)
    LT_CHECK(q.mag[i] > q.mag[i - 1], "dynamic map: levels not increasing at {} ({} <= {})", i, q.mag[i],
             q.mag[i - 1]);
  for (int i = 0; i + 1 < q.levels; ++i) q.thr[i] = 0.5f * (q.mag[i] + q.mag[i + 1]);
  q.thr[q.levels - 1] = std::numeric_limits<float>::infinity();
  // Second moment: a positive v never rounds to 0 (it rounds up to the smallest level instead). A v
  // stored as 0 next to a non-zero m makes the next steps' m / sqrt(v) explode for that element: the
  // "zero-point problem" of quantised second moments (Li et al. 2023, 4-bit optimizer states).
  if (!is_signed) q.thr[0] = 0.0f;
  for (int c = 0; c < 256; ++c) {
    if (is_signed)
      q.decode[c] = (c & 0x80) ? -q.mag[c & 0x7f] : q.mag[c & 0x7f];
    else
      q.decode[c] = q.mag[c];
  }
  // Bucket table. Bucket 0 ends at or below the first positive threshold, so it holds at most thr[0] = 0.
  q.base = int32_t(f32_bits(q.thr[is_signed ? 0 : 1]) >> QuantMap::kShift) - 1;
  int32_t top_bucket = int32_t(f32_bits(2.0f) >> QuantMap::kShift) - q.base;  // covers [1, 2)
  q.buckets = top_bucket + 1;
  q.lut.assign(size_t(q.buckets) + 3, 0);
  auto bucket_start = [&](int32_t b) -> float {
    if (b == 0) return 0.0f;
    uint32_t bits = uint32_t(b + q.base) << QuantMap::kShift;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  int t = 0;  // number of finite thresholds below the current bucket start
  for (int32_t b = 0; b < q.buckets; ++b) {
    float lo = bucket_start(b);
    while (t < q.levels - 1 && q.thr[t] < lo) ++t;
    q.lut[size_t(b)] = uint8_t(t);
    if (b + 1 < q.buckets) {
      float hi = bucket_start(b + 1);
      int inside = 0;
      for (int i = t; i < q.levels - 1 && q.thr[i] < hi; ++i) ++inside;
      LT_CHECK(inside <= 1, "dynamic map: bucket {} [{}, {}) holds {} thresholds (need <= 1)", b, lo, hi, inside);
    }
  }
  return q;
}

const QuantMap& signed_dynamic_map() {
  static const QuantMap q = build_dynamic_map(true);
  return q;
}
const QuantMap& unsigned_dynamic_map() {
  static const QuantMap q = build_dynamic_map(false);
  return q;
}

float quantize_block(const QuantMap& q, const float* x, int64_t n, uint8_t* codes) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  float inv = amax > 0 ? 1.0f / amax : 0.0f;
  for (int64_t i = 0; i < n; ++i) codes[i] = quantize_one(q, x[i] * inv);
  return amax;
}

void dequantize_block(const QuantMap& q, const uint8_t* codes, int64_t n, float absmax, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] = dequantize_one(q, codes[i], absmax);
}

}  // namespace lt::optim
