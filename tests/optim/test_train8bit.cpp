// 8-bit states train as well as fp32: a small MLP classifier (teacher-student, synthetic data) trained
// for 300 full-batch steps with the weight matrices' moments in 8 bits reaches a loss within 2% of the
// fp32 run. Targets are a random teacher's soft class probabilities, so the loss has a floor (the
// teacher's entropy) above 0 and relative differences are meaningful.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "helpers.h"

using namespace lt::optim;
using namespace lt::optim::test;

namespace {

constexpr int kIn = 32, kHid = 32, kOut = 10, kBatch = 1024;

// Unit layout: W1 [kHid,kIn], b1 [kHid], W2 [kOut,kHid], b2 [kOut].
struct Mlp {
  UnitSpec spec;
  int64_t oW1, ob1, oW2, ob2;
  explicit Mlp(bool q8) {
    StateFormat mat = q8 ? StateFormat::Q8 : StateFormat::F32;
    spec = make_unit({kHid * kIn, kHid, kOut * kHid, kOut}, {mat, StateFormat::F32, mat, StateFormat::F32}, {0, 1, 0, 1});
    oW1 = spec.tensors[0].offset;
    ob1 = spec.tensors[1].offset;
    oW2 = spec.tensors[2].offset;
    ob2 = spec.tensors[3].offset;
  }
  // Mean cross-entropy; grad (if non-null) gets d loss / d params.
  double loss(const std::vector<float>& w, const std::vector<float>& x, const std::vector<float>& y, float* grad) const {
    if (grad) std::fill(grad, grad + spec.numel, 0.0f);
    double total = 0;
    std::vector<float> h(kHid), z(kOut), dz(kOut), dh(kHid);
    for (int n = 0; n < kBatch; ++n) {
      const float* xn = &x[size_t(n * kIn)];
      for (int j = 0; j < kHid; ++j) {
        float a = w[size_t(ob1 + j)];
        for (int i = 0; i < kIn; ++i) a += w[size_t(oW1 + j * kIn + i)] * xn[i];
        h[size_t(j)] = std::tanh(a);
      }
      float zmax = -1e30f;
      for (int k = 0; k < kOut; ++k) {
        float a = w[size_t(ob2 + k)];
        for (int j = 0; j < kHid; ++j) a += w[size_t(oW2 + k * kHid + j)] * h[size_t(j)];
        z[size_t(k)] = a;
        zmax = std::max(zmax, a);
      }
      double se = 0;
      for (int k = 0; k < kOut; ++k) se += std::exp(double(z[size_t(k)] - zmax));
      const float* yn = &y[size_t(n * kOut)];
      for (int k = 0; k < kOut; ++k) total += yn[k] * (std::log(se) + zmax - z[size_t(k)]);
      if (!grad) continue;
      for (int k = 0; k < kOut; ++k)
        dz[size_t(k)] = float(std::exp(double(z[size_t(k)] - zmax)) / se - yn[k]) / kBatch;
      std::fill(dh.begin(), dh.end(), 0.0f);
      for (int k = 0; k < kOut; ++k) {
        grad[ob2 + k] += dz[size_t(k)];
        for (int j = 0; j < kHid; ++j) {
          grad[oW2 + k * kHid + j] += dz[size_t(k)] * h[size_t(j)];
          dh[size_t(j)] += dz[size_t(k)] * w[size_t(oW2 + k * kHid + j)];
        }
      }
      for (int j = 0; j < kHid; ++j) {
        float da = dh[size_t(j)] * (1 - h[size_t(j)] * h[size_t(j)]);
        grad[ob1 + j] += da;
        for (int i = 0; i < kIn; ++i) grad[oW1 + j * kIn + i] += da * xn[i];
      }
    }
    return total / kBatch;
  }
};

double train(bool q8) {
  Mlp net(q8);
  // Data labelled by a random teacher of the same shape.
  Mlp teacher(false);
  std::vector<float> tw = randn(teacher.spec.numel, 77, 1.0f);
  std::vector<float> x = randn(int64_t(kBatch) * kIn, 78);
  // Soft targets: the teacher's class probabilities. The loss floor is the teacher's entropy (> 0).
  std::vector<float> y(size_t(kBatch) * kOut);
  {
    std::vector<float> h(kHid);
    for (int n = 0; n < kBatch; ++n) {
      for (int j = 0; j < kHid; ++j) {
        float a = 0;
        for (int i = 0; i < kIn; ++i) a += tw[size_t(teacher.oW1 + j * kIn + i)] * x[size_t(n * kIn + i)] / 5.7f;
        h[size_t(j)] = std::tanh(a);
      }
      double z[kOut], zmax = -1e30, se = 0;
      for (int k = 0; k < kOut; ++k) {
        double a = 0;
        for (int j = 0; j < kHid; ++j) a += tw[size_t(teacher.oW2 + k * kHid + j)] * h[size_t(j)];
        z[k] = 2 * a;  // sharp teacher: low entropy floor
        zmax = std::max(zmax, z[k]);
      }
      for (int k = 0; k < kOut; ++k) se += std::exp(z[k] - zmax);
      for (int k = 0; k < kOut; ++k) y[size_t(n * kOut + k)] = float(std::exp(z[k] - zmax) / se);
    }
  }
  std::vector<float> w = randn(net.spec.numel, 79, 0.15f), g(size_t(net.spec.numel));
  AdamWConfig cfg;
  cfg.groups = {{1.0f, 0.01f}, {1.0f, 0.0f}};
  cfg.max_grad_norm = 1.0f;
  cfg.threads = 2;
  CpuAdamW opt({net.spec}, cfg);
  for (int step = 0; step < 300; ++step) {
    double l = net.loss(w, x, y, g.data());
    if (std::getenv("LT_TRAIN8_TRACE") && step % 25 == 0) std::printf("%s step %d loss %.5f\n", q8 ? "q8" : "f32", step, l);
    opt.step(3e-3f, {{w.data(), g.data(), nullptr}});
  }
  return net.loss(w, x, y, nullptr);
}

}  // namespace

TEST(Train8bit, LossWithinTwoPercentOfFp32) {
  double l32 = train(false), l8 = train(true);
  std::printf("final loss after 300 steps: fp32 %.5f, 8-bit %.5f (rel diff %.3f%%)\n", l32, l8,
              100 * std::fabs(l8 - l32) / l32);
  EXPECT_LT(l32, 1.0);  // it did learn (initial loss ~ln 10 = 2.3)
  EXPECT_LE(std::fabs(l8 - l32) / l32, 0.02);
}
