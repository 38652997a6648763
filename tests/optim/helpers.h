// Shared helpers for the optimizer tests.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/error.h"
#include "optim/optimizer.h"

namespace lt::optim::test {

inline std::vector<float> randn(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = d(rng);
  return x;
}

// Double-precision AdamW (PyTorch semantics) for one element. The decay factor 1 - lr*wd is taken
// rounded to fp32, as PyTorch applies it to an fp32 tensor: that rounding is a systematic part of the
// semantics (it alone drifts ~3e-8 relative per step), not arithmetic error of the kernel.
struct RefAdamW {
  double lr, wd, b1, b2, eps;
  void step(double& p, double g, double& m, double& v, int64_t t) const {
    p *= double(float(1.0 - lr * wd));
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    double mh = m / (1 - std::pow(b1, double(t)));
    double vh = v / (1 - std::pow(b2, double(t)));
    p -= lr * mh / (std::sqrt(vh) + eps);
  }
};

// One unit with the given tensor sizes, formats and groups, packed with kParamAlign-like padding.
inline UnitSpec make_unit(const std::vector<int64_t>& sizes, const std::vector<StateFormat>& fmts,
                          const std::vector<int>& groups) {
  UnitSpec u;
  int64_t off = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    TensorSpec t;
    t.name = "t" + std::to_string(i);
    t.offset = off;
    t.numel = sizes[i];
    t.format = fmts[i];
    t.group = groups[i];
    u.tensors.push_back(t);
    off += (sizes[i] + 63) / 64 * 64;
  }
  u.numel = off;
  return u;
}

}  // namespace lt::optim::test
