#include "optim/quant8.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace lt::optim {

QuantMap build_dynamic_map(bool is_signed) {
  QuantMap q;
  q.is_signed = is_signed;
  q.mag_bits = is_signed ? 7 : 8;
  q.levels = 1 << q.mag_bits;
  // Magnitude code bits: E leading zeros, the indicator bit, R = mag_bits-1-E fraction bits k. Level
  // 10^-E * (0.1 + 0.9 (k+1) / 2^R), on the decade's line fma(step, c, base). More leading zeros = lower
  // decade, so codes order like their levels.
  for (int e = 0; e < q.mag_bits; ++e) {
    int n = 1 << (q.mag_bits - 1 - e);
    double top = std::pow(10.0, -e);
    q.top[e] = float(top);
    q.step[e] = float(0.9 * top / n);
    q.base[e] = std::fma(-q.step[e], float(2 * n - 1), q.top[e]);
    q.inv_step[e] = float(1.0 / double(q.step[e]));
    q.code_off[e] = float(-double(q.base[e]) / double(q.step[e]));
    for (int c = n; c < 2 * n; ++c) q.mag[c] = std::fma(q.step[e], float(c), q.base[e]);  // the definition
    // The decade's top code lands exactly on 10^-e (decade 0: 1.0, so a block's absmax is stored exactly).
    LT_CHECK(q.mag[2 * n - 1] == q.top[e], "dynamic map: decade {} top {} != {}", e, q.mag[2 * n - 1], q.top[e]);
  }
  q.mag[0] = 0.0f;
  // Bottom decade (code 1 only): signed, the nearest of 0 and mag[1]; unsigned, mag[1] for any value > 0.
  const int bottom = q.mag_bits - 1;
  q.inv_step[bottom] = is_signed ? float(1.0 / double(q.mag[1])) : 0.0f;
  q.code_off[bottom] = is_signed ? 0.0f : 1.0f;
  for (int i = 1; i < q.levels; ++i)
    LT_CHECK(q.mag[i] > q.mag[i - 1], "dynamic map: levels not increasing at {} ({} <= {})", i, q.mag[i],
             q.mag[i - 1]);
  for (int c = 0; c < 256; ++c) {
    if (is_signed)
      q.decode[c] = (c & 0x80) ? -q.mag[c & 0x7f] : q.mag[c & 0x7f];
    else
      q.decode[c] = q.mag[c];
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
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float inv = block_inv(amax);
  for (int64_t i = 0; i < n; ++i) codes[i] = quantize_one(q, x[i] * inv);
  return amax;
}

void dequantize_block(const QuantMap& q, const uint8_t* codes, int64_t n, float absmax, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] = dequantize_one(q, codes[i], absmax);
}

}  // namespace lt::optim
