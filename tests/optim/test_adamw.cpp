// fp32 AdamW against a double-precision reference and against a float replica of PyTorch's op order.
#include <gtest/gtest.h>

#include <algorithm>

#include "helpers.h"
#include "optim/adamw_kernels.h"

using namespace lt::optim;
using namespace lt::optim::test;

namespace {

// torch.optim.AdamW (single-tensor) op order in float, with torch's python-float scalars.
void torch_like_step(float& p, float g, float& m, float& v, double lr, double wd, double b1, double b2, double eps,
                     int64_t t) {
  p = p * float(1.0 - lr * wd);
  m = m + float(1.0 - b1) * (g - m);
  v = v * float(b2) + (float(1.0 - b2) * g) * g;
  double bc1 = 1.0 - std::pow(b1, double(t)), bc2 = 1.0 - std::pow(b2, double(t));
  float denom = std::sqrt(v) / float(std::sqrt(bc2)) + float(eps);
  p = p + (float(-(lr / bc1)) * m) / denom;
}

}  // namespace

TEST(AdamW, MatchesDoubleReferenceOver100StepsWithGroups) {
  // Three tensors: decayed (group 0), not decayed (group 1), decayed with a scaled lr (group 2).
  UnitSpec u = make_unit({1000, 77, 4099}, {StateFormat::F32, StateFormat::F32, StateFormat::F32}, {0, 1, 2});
  AdamWConfig cfg;
  cfg.groups = {{1.0f, 0.1f}, {1.0f, 0.0f}, {0.5f, 0.05f}};
  cfg.max_grad_norm = 0;  // no clipping here
  cfg.threads = 2;
  cfg.chunk_elems = 512;  // several work items per tensor
  CpuAdamW opt({u}, cfg);
  std::vector<float> master = randn(u.numel, 1), grad(size_t(u.numel));
  std::vector<lt::bf16_t> copy(size_t(u.numel));
  std::vector<double> pd(master.begin(), master.end()), md(size_t(u.numel)), vd(size_t(u.numel));
  std::vector<float> pf = master, mf(size_t(u.numel)), vf(size_t(u.numel));
  const float lr = 1e-2f;
  for (int step = 1; step <= 100; ++step) {
    std::vector<float> g = randn(u.numel, 1000 + step, 0.1f);
    std::copy(g.begin(), g.end(), grad.begin());
    StepInfo info = opt.step(lr, {{master.data(), grad.data(), copy.data()}});
    ASSERT_EQ(info.step, step);
    ASSERT_FALSE(info.skipped);
    for (size_t ti = 0; ti < u.tensors.size(); ++ti) {
      const TensorSpec& t = u.tensors[ti];
      const GroupHyper& gh = cfg.groups[size_t(t.group)];
      double glr = double(lr) * gh.lr_scale;
      RefAdamW ref{glr, gh.weight_decay, cfg.beta1, cfg.beta2, cfg.eps};
      for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
        ref.step(pd[size_t(i)], g[size_t(i)], md[size_t(i)], vd[size_t(i)], step);
        torch_like_step(pf[size_t(i)], g[size_t(i)], mf[size_t(i)], vf[size_t(i)], glr, gh.weight_decay, cfg.beta1,
                        cfg.beta2, cfg.eps, step);
      }
    }
  }
  for (size_t ti = 0; ti < u.tensors.size(); ++ti) {
    const TensorSpec& t = u.tensors[ti];
    std::vector<float> m, v;
    opt.read_state(0, int(ti), m, v);
    double max_ref = 0, max_err = 0, max_m = 0, err_m = 0, max_v = 0, err_v = 0;
    for (int64_t k = 0; k < t.numel; ++k) {
      size_t i = size_t(t.offset + k);
      max_ref = std::max(max_ref, std::fabs(pd[i]));
      max_err = std::max(max_err, std::fabs(master[i] - pd[i]));
      max_m = std::max(max_m, std::fabs(md[i]));
      err_m = std::max(err_m, std::fabs(m[size_t(k)] - md[i]));
      max_v = std::max(max_v, std::fabs(vd[i]));
      err_v = std::max(err_v, std::fabs(v[size_t(k)] - vd[i]));
      // The float replica of torch's op order is reproduced exactly.
      ASSERT_EQ(master[i], pf[i]) << t.name << " element " << k;
      ASSERT_EQ(copy[i], lt::f32_to_bf16(master[i]));
    }
    std::printf("%s: 100 steps, max |p - p_ref| / max |p_ref| = %.2e, m %.2e, v %.2e\n", t.name.c_str(),
                max_err / max_ref, err_m / max_m, err_v / max_v);
    EXPECT_LE(max_err / max_ref, 1e-6) << t.name;
    EXPECT_LE(err_m / max_m, 1e-6) << t.name;
    EXPECT_LE(err_v / max_v, 1e-6) << t.name;
  }
}

TEST(AdamW, FirstStepIsSignedLrStepAfterBiasCorrection) {
  // With bias correction, step 1 moves each weight by lr * g/|g| (eps negligible), after decay.
  UnitSpec u = make_unit({256, 256}, {StateFormat::F32, StateFormat::F32}, {0, 1});
  AdamWConfig cfg;
  cfg.groups = {{1.0f, 0.5f}, {1.0f, 0.0f}};
  cfg.max_grad_norm = 0;
  cfg.eps = 1e-12f;
  cfg.threads = 1;
  CpuAdamW opt({u}, cfg);
  std::vector<float> p0 = randn(u.numel, 3), p = p0, g = randn(u.numel, 4);
  opt.step(0.01f, {{p.data(), g.data(), nullptr}});
  for (size_t ti = 0; ti < 2; ++ti) {
    const TensorSpec& t = u.tensors[ti];
    double wd = cfg.groups[size_t(t.group)].weight_decay;
    for (int64_t k = 0; k < t.numel; ++k) {
      size_t i = size_t(t.offset + k);
      double expect = p0[i] * (1 - 0.01 * wd) - 0.01 * (g[i] > 0 ? 1 : -1);
      ASSERT_NEAR(p[i], expect, 1e-6) << "tensor " << ti << " element " << k;
    }
  }
}

TEST(AdamW, ScalarsFollowTorchDefinitions) {
  AdamWScalars s = make_adamw_scalars(1e-3, 0.1, 0.9, 0.999, 1e-8, 3, 0.5f);
  EXPECT_FLOAT_EQ(s.decay, float(1 - 1e-4));
  EXPECT_FLOAT_EQ(s.neg_step_size, float(-1e-3 / (1 - 0.9 * 0.9 * 0.9)));
  EXPECT_FLOAT_EQ(s.bc2_sqrt, float(std::sqrt(1 - std::pow(0.999, 3))));
  EXPECT_EQ(s.grad_scale, 0.5f);
  EXPECT_THROW(make_adamw_scalars(1e-3, 0, 0.9, 0.999, 1e-8, 0, 1), lt::Error);
}

TEST(AdamW, RejectsBadConfiguration) {
  UnitSpec u = make_unit({10}, {StateFormat::F32}, {0});
  AdamWConfig cfg;
  cfg.beta1 = 1.0f;
  EXPECT_THROW(CpuAdamW({u}, cfg), lt::Error);
  cfg = AdamWConfig{};
  u.tensors[0].group = 7;
  EXPECT_THROW(CpuAdamW({u}, cfg), lt::Error);
  u.tensors[0].group = 0;
  u.tensors[0].numel = u.numel + 1;
  EXPECT_THROW(CpuAdamW({u}, cfg), lt::Error);
}
