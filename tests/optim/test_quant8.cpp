// The dynamic maps and blockwise quantisation: nearest-level rounding and the per-block error bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "helpers.h"
#include "optim/adamw_kernels.h"
#include "optim/quant8.h"

using namespace lt::optim;
using namespace lt::optim::test;

namespace {

// Nearest level by brute force (ties may go either way). For the unsigned (second-moment) map a
// positive value never goes to 0, so its candidates are the non-zero levels.
float nearest_level_dist(const QuantMap& q, float y) {
  float best = INFINITY;
  for (int c = 0; c < 256; ++c) {
    if (!q.is_signed && y > 0 && q.decode[c] == 0) continue;
    best = std::min(best, std::fabs(q.decode[c] - y));
  }
  return best;
}

// The distance between the two levels around |y| (the local resolution of the map).
float local_gap(const QuantMap& q, float a) {
  if (!q.is_signed && a > 0 && a < q.mag[1]) return 2 * q.mag[1];  // rounds up to mag[1]: error < mag[1]
  for (int i = 0; i + 1 < q.levels; ++i)
    if (a >= q.mag[i] && a <= q.mag[i + 1]) return q.mag[i + 1] - q.mag[i];
  return 0;
}

}  // namespace

TEST(Quant8, MapsHaveTheDynamicTreeStructure) {
  for (bool s : {true, false}) {
    const QuantMap& q = s ? signed_dynamic_map() : unsigned_dynamic_map();
    EXPECT_EQ(q.levels, s ? 128 : 256);
    for (int c = 0; c < q.levels; ++c) EXPECT_EQ(quantize_one(q, q.mag[c]), c) << "level " << c << " round trip";
    EXPECT_EQ(q.mag[0], 0.0f);
    EXPECT_EQ(q.mag[q.levels - 1], 1.0f);  // absmax is exact
    for (int i = 1; i < q.levels; ++i) EXPECT_GT(q.mag[i], q.mag[i - 1]);
    // Smallest non-zero level: 10^-(mag_bits-1).
    EXPECT_FLOAT_EQ(q.mag[1], float(std::pow(10.0, -(q.mag_bits - 1))));
    // Decade 0 (indicator at the top bit) has 2^(mag_bits-1) linear levels over (0.1, 1].
    int top = q.levels / 2;
    EXPECT_NEAR(q.mag[top], 0.1f + 0.9f / float(top), 1e-6f);
    EXPECT_NEAR(q.mag[top + 1] - q.mag[top], 0.9f / float(top), 1e-6f);
  }
  const QuantMap& q = signed_dynamic_map();
  for (int c = 0; c < 128; ++c) EXPECT_EQ(q.decode[c | 0x80], -q.decode[c]);
  // Second moment: 0 stays 0, the tiniest positive value goes to the smallest level, not to 0.
  const QuantMap& u = unsigned_dynamic_map();
  EXPECT_EQ(quantize_one(u, 0.0f), 0);
  EXPECT_EQ(quantize_one(u, 1e-30f), 1);
  EXPECT_EQ(quantize_one(q, 1e-30f), 0);
}

TEST(Quant8, QuantizeOneIsNearestLevel) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), e(-9.0f, 0.0f);
  for (bool s : {true, false}) {
    const QuantMap& q = s ? signed_dynamic_map() : unsigned_dynamic_map();
    std::vector<float> ys = {0.0f, 1.0f, 1e-12f, 1e-6f, 5e-7f, 0.1f, 0.55f, 0.9999f, 1.0000001f};
    for (int i = 0; i < 20000; ++i) ys.push_back(u(rng));
    for (int i = 0; i < 20000; ++i) ys.push_back(std::pow(10.0f, e(rng)));  // log-uniform magnitudes
    for (int i = 0; i + 1 < q.levels; ++i) {  // around every midpoint and every level
      float mid = 0.5f * (q.mag[i] + q.mag[i + 1]);
      for (float z : {mid, q.mag[i]}) {
        ys.push_back(std::nextafter(z, 0.0f));
        ys.push_back(z);
        ys.push_back(std::nextafter(z, 2.0f));
      }
    }
    for (float y : ys) {
      if (!s) y = std::fabs(y);
      for (float yy : s ? std::vector<float>{y, -y} : std::vector<float>{y}) {
        uint8_t c = quantize_one(q, yy);
        float yc = std::min(std::max(yy, -1.0f), 1.0f);
        float d = std::fabs(q.decode[c] - yc);
        // Nearest, up to float rounding of the index arithmetic right at a midpoint: a wrong choice only
        // within ~1e-5 of a spacing of it (quant8.h), so at most 2e-5 spacings farther than the nearest.
        ASSERT_LE(d, nearest_level_dist(q, yc) + 2e-5f * local_gap(q, std::fabs(yc)))
            << (s ? "signed" : "unsigned") << " y=" << yy << " code=" << int(c);
      }
    }
  }
}

TEST(Quant8, BlockErrorWithinPromisedBound) {
  // Per block of 256: |x - dequant(quant(x))| <= absmax * gap(|x|/absmax) / 2 (+ rounding of x/absmax),
  // (for v below the smallest level: <= absmax * smallest level, as it rounds up, never to 0),
  // and the absmax element is exact. Moment-like data: heavy-tailed, spanning decades.
  for (bool s : {true, false}) {
    const QuantMap& q = s ? signed_dynamic_map() : unsigned_dynamic_map();
    std::vector<float> x = randn(kQ8Block * 40 + 17, s ? 21 : 22);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = x[i] * std::pow(10.0f, float(int(i % 7)) - 4.0f);
      if (!s) x[i] = x[i] * x[i];
    }
    std::vector<uint8_t> codes(kQ8Block);
    std::vector<float> back(kQ8Block);
    double worst_ratio = 0;
    for (size_t b0 = 0; b0 < x.size(); b0 += kQ8Block) {
      int64_t len = std::min<int64_t>(kQ8Block, int64_t(x.size() - b0));
      float amax = quantize_block(q, x.data() + b0, len, codes.data());
      dequantize_block(q, codes.data(), len, amax, back.data());
      for (int64_t i = 0; i < len; ++i) {
        float xi = x[b0 + size_t(i)];
        float a = std::fabs(xi) / amax;
        double bound = amax * local_gap(q, std::min(a, 1.0f)) / 2 + 4e-7 * std::fabs(xi) + 1e-30;
        double err = std::fabs(double(back[size_t(i)]) - xi);
        ASSERT_LE(err, bound) << "block " << b0 / kQ8Block << " element " << i << " x=" << xi << " amax=" << amax;
        if (std::fabs(xi) == amax) {
          ASSERT_EQ(std::fabs(back[size_t(i)]), amax);
        }
        worst_ratio = std::max(worst_ratio, err / bound);
      }
    }
    EXPECT_GT(worst_ratio, 0.5);  // the bound is tight, not vacuous
  }
}

TEST(Quant8, KernelStoresNearestCodesOfTheUpdatedMoments) {
  // One q8 step from zero state: m' = (1-b1) g, v' = (1-b2) g^2 exactly representable in fp32 math.
  int64_t n = 3 * kQ8Block + 5;
  std::vector<float> p(size_t(n), 0.f), g = randn(n, 9), ms(4), vs(4);
  std::vector<uint8_t> mq(static_cast<size_t>(n)), vq(static_cast<size_t>(n));
  AdamWScalars s = make_adamw_scalars(1e-3, 0, 0.9, 0.999, 1e-8, 1, 1.0f);
  adamw_q8(Isa::Auto, s, p.data(), g.data(), mq.data(), vq.data(), ms.data(), vs.data(), nullptr, n);
  for (int64_t b = 0; b < 4; ++b) {
    int64_t len = std::min<int64_t>(kQ8Block, n - b * kQ8Block);
    std::vector<float> m(static_cast<size_t>(len)), v(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) {
      float gi = g[size_t(b * kQ8Block + i)];
      m[size_t(i)] = 0.0f + s.w1 * (gi - 0.0f);
      v[size_t(i)] = 0.0f * s.beta2 + (s.w2 * gi) * gi;
    }
    std::vector<uint8_t> cm(static_cast<size_t>(len)), cv(static_cast<size_t>(len));
    EXPECT_EQ(ms[size_t(b)], quantize_block(signed_dynamic_map(), m.data(), len, cm.data()));
    EXPECT_EQ(vs[size_t(b)], quantize_block(unsigned_dynamic_map(), v.data(), len, cv.data()));
    for (int64_t i = 0; i < len; ++i) {
      ASSERT_EQ(mq[size_t(b * kQ8Block + i)], cm[size_t(i)]);
      ASSERT_EQ(vq[size_t(b * kQ8Block + i)], cv[size_t(i)]);
    }
  }
}
