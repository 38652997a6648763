// Finite-difference gradient checks for the fp32 reference ops.
// f() returns a scalar in double (e.g. sum_i r_i * y_i); grad is the analytic df/dx.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace lt::test {

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

inline double dotd(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

inline double norm2(const std::vector<float>& a) { return std::sqrt(dotd(a, a)); }

// Central differences of f along 3 random directions and at the 4 coordinates with the largest |grad|.
// Tolerances suit fp32 forward evaluation (step h): observed errors are ~1e-5 relative; a 1% error in
// any gradient fails.
inline void expect_grad(const std::function<double()>& f, std::vector<float>& x, const std::vector<float>& grad,
                        const std::string& what, float h = 1e-2f, double rtol = 2e-3) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  const double gnorm = norm2(grad);
  for (int dir = 0; dir < 3; ++dir) {
    auto d = randn(x.size(), 1000 + dir);
    const double dn = norm2(d);
    for (auto& v : d) v = float(v / dn);
    const auto x0 = x;
    for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] + h * d[i];
    const double fp = f();
    for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] - h * d[i];
    const double fm = f();
    x = x0;
    const double fd = (fp - fm) / (2.0 * h), an = dotd(grad, d);
    if (getenv("LT_GRAD_DEBUG")) printf("%s dir %d fd %.8g an %.8g relerr %.3g gnorm %.3g\n", what.c_str(), dir, fd, an, std::fabs(fd - an) / std::fabs(an), gnorm);
    EXPECT_NEAR(fd, an, rtol * std::fabs(an) + 1e-4 * gnorm + 1e-7) << what << ": directional derivative " << dir;
  }
  std::vector<size_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  const size_t k = std::min<size_t>(4, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(),
                    [&](size_t a, size_t b) { return std::fabs(grad[a]) > std::fabs(grad[b]); });
  for (size_t t = 0; t < k; ++t) {
    const size_t i = idx[t];
    const float xi = x[i];
    x[i] = xi + h;
    const double fp = f();
    x[i] = xi - h;
    const double fm = f();
    x[i] = xi;
    const double fd = (fp - fm) / (2.0 * h);
    if (getenv("LT_GRAD_DEBUG")) printf("%s coord %zu fd %.8g an %.8g relerr %.3g\n", what.c_str(), i, fd, double(grad[i]), std::fabs(fd - grad[i]) / std::fabs(grad[i]));
    EXPECT_NEAR(fd, grad[i], rtol * std::fabs(grad[i]) + 2e-5 * gnorm + 1e-7) << what << ": coordinate " << i;
  }
}

}  // namespace lt::test
