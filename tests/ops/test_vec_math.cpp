// The AVX2 exp and row kernels used by cross-entropy, against libm.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/vec_math.h"

using namespace lt::cpu;

TEST(VecMath, ExpRelativeErrorBelowTwoUlpOverRange) {
  double worst = 0;
  for (float x = -87.0f; x <= 87.99f; x += 0.01371f) {  // inputs are clamped to [-87, 88]
    float in[8], out[8];
    for (int l = 0; l < 8; ++l) out[l] = in[l] = x + float(l) * 1e-3f;
    vec::exp_scale_inplace(out, 8, 0.0f, 1.0f);
    for (int l = 0; l < 8; ++l) {
      const double ref = std::exp(double(in[l]));
      worst = std::max(worst, std::fabs(out[l] - ref) / ref);
    }
  }
  EXPECT_LT(worst, 2.5e-7) << "max relative error";  // 2 ulp of fp32 is 2.4e-7
}

TEST(VecMath, RowKernelsMatchScalarIncludingTails) {
  for (int64_t n : {1, 7, 8, 9, 301}) {
    std::vector<float> z(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) z[size_t(i)] = std::sin(float(i) * 1.7f) * 9.0f;
    float m = -INFINITY;
    double s = 0;
    for (auto v : z) m = std::max(m, v);
    for (auto v : z) s += std::exp(double(v) - m);
    EXPECT_EQ(vec::row_max(z.data(), n), m) << n;
    EXPECT_NEAR(vec::sum_exp(z.data(), n, m), s, 1e-6 * s) << n;
    auto w = z;
    vec::exp_scale_inplace(w.data(), n, m, 0.5f);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(w[size_t(i)], 0.5 * std::exp(double(z[size_t(i)]) - m), 1e-6) << n << " " << i;
  }
}

#include "backend/cpu/blas_setup.h"

TEST(BlasSetup, ReportsKernelFamilies) {
  EXPECT_FALSE(lt::cpu::blas_core_name().empty());
  // lt_backend is compiled for x86-64-v3 (AVX2 + FMA), so a fast family always exists here.
  const std::string best = lt::cpu::best_blas_core_for_cpu();
  EXPECT_TRUE(best == "SkylakeX" || best == "Haswell") << best;
}
