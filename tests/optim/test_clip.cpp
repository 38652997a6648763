// Global-norm clipping (torch.nn.utils.clip_grad_norm_ semantics) and non-finite gradients.
#include <gtest/gtest.h>

#include <limits>

#include "helpers.h"

using namespace lt::optim;
using namespace lt::optim::test;

namespace {

struct Model {
  std::vector<UnitSpec> units;
  std::vector<std::vector<float>> p, g;
  std::vector<std::vector<lt::bf16_t>> out;
  std::vector<UnitBuffers> bufs() {
    std::vector<UnitBuffers> b;
    for (size_t u = 0; u < units.size(); ++u) b.push_back({p[u].data(), g[u].data(), out[u].data()});
    return b;
  }
};

Model make_model(float grad_scale) {
  Model m;
  m.units = {make_unit({300}, {StateFormat::F32}, {1}), make_unit({1024, 64}, {StateFormat::Q8, StateFormat::F32}, {0, 1}),
             make_unit({513}, {StateFormat::F32}, {0})};
  for (size_t u = 0; u < m.units.size(); ++u) {
    m.p.push_back(randn(m.units[u].numel, 50 + u));
    m.g.push_back(randn(m.units[u].numel, 60 + u, grad_scale));
    m.out.emplace_back(size_t(m.units[u].numel), lt::bf16_t(0));
  }
  return m;
}

double total_norm(const Model& m) {
  double s = 0;
  for (auto& g : m.g)
    for (float x : g) s += double(x) * double(x);
  return std::sqrt(s);
}

}  // namespace

TEST(Clip, CoefficientHasTorchSemantics) {
  EXPECT_EQ(clip_coefficient(0.5, 1.0f), 1.0f);    // below threshold: no-op
  EXPECT_LT(clip_coefficient(1.0, 1.0f), 1.0f);    // exactly at max_norm: 1/(1+1e-6) < 1 clips
  EXPECT_FLOAT_EQ(clip_coefficient(4.0, 1.0f), 1.0f / (4.0f + 1e-6f));
  EXPECT_EQ(clip_coefficient(100.0, 0.0f), 1.0f);  // disabled
}

TEST(Clip, AboveAndBelowThresholdEqualsClippedReference) {
  for (float scale : {0.001f, 1.0f}) {  // total norm ~0.04 (below 1) and ~40 (above 1)
    Model a = make_model(scale), b = make_model(scale);
    double norm = total_norm(a);
    float coef = std::min(1.0f, 1.0f / (float(norm) + 1e-6f));
    // Reference: clip the gradients in place like torch, then an unclipped optimizer.
    for (auto& g : b.g)
      for (float& x : g) x *= coef;
    AdamWConfig ca;
    ca.threads = 2;
    ca.max_grad_norm = 1.0f;
    AdamWConfig cb = ca;
    cb.max_grad_norm = 0;
    CpuAdamW oa(a.units, ca), ob(b.units, cb);
    StepInfo ia = oa.step(1e-3f, a.bufs());
    ob.step(1e-3f, b.bufs());
    EXPECT_NEAR(ia.grad_norm, norm, 1e-9 * norm);
    EXPECT_EQ(ia.clip_coef, coef);
    if (scale < 0.01f) {
      EXPECT_EQ(ia.clip_coef, 1.0f);
    } else {
      EXPECT_LT(ia.clip_coef, 0.1f);
    }
    for (size_t u = 0; u < a.units.size(); ++u) {
      EXPECT_EQ(a.p[u], b.p[u]) << "unit " << u << " scale " << scale;
      EXPECT_EQ(a.out[u], b.out[u]);
    }
  }
}

TEST(Clip, NanGradientSkipsTheStepAndLeavesStateUntouched) {
  Model a = make_model(1.0f);
  AdamWConfig cfg;
  cfg.threads = 2;
  CpuAdamW opt(a.units, cfg);
  opt.step(1e-3f, a.bufs());  // one real step so the state is non-zero
  auto p_before = a.p;
  auto out_before = a.out;
  std::vector<float> m0, v0, m1, v1;
  opt.read_state(1, 0, m0, v0);
  a.g[1][17] = std::numeric_limits<float>::quiet_NaN();
  StepInfo info = opt.step(1e-3f, a.bufs());
  EXPECT_TRUE(info.skipped);
  EXPECT_EQ(info.step, 1);
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_EQ(opt.stats().skipped_steps, 1);
  EXPECT_EQ(a.p, p_before);
  EXPECT_EQ(a.out, out_before);
  opt.read_state(1, 0, m1, v1);
  EXPECT_EQ(m0, m1);
  EXPECT_EQ(v0, v1);
  // The next finite step proceeds as step 2.
  a.g[1][17] = 0.5f;
  info = opt.step(1e-3f, a.bufs());
  EXPECT_FALSE(info.skipped);
  EXPECT_EQ(info.step, 2);
}

TEST(Clip, InfGradientWithStopPolicyThrows) {
  Model a = make_model(1.0f);
  AdamWConfig cfg;
  cfg.threads = 1;
  cfg.on_nonfinite = NonFinitePolicy::Stop;
  CpuAdamW opt(a.units, cfg);
  auto p_before = a.p;
  a.g[0][3] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(opt.step(1e-3f, a.bufs()), lt::Error);
  EXPECT_EQ(a.p, p_before);
  EXPECT_EQ(opt.step_count(), 0);
}

// Where a non-finite norm came from: the units whose partial sums are non-finite, for the step that skipped, and none
// once a finite step follows.
TEST(Clip, NonFiniteUnitsNameTheUnitsWhosePartialSumIsNonFinite) {
  Model a = make_model(1.0f);
  AdamWConfig cfg;
  cfg.threads = 1;
  CpuAdamW opt(a.units, cfg);
  a.g[1][5] = std::numeric_limits<float>::quiet_NaN();
  a.g[2][0] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(opt.step(1e-3f, a.bufs()).skipped);
  EXPECT_EQ(opt.nonfinite_units(), (std::vector<int>{1, 2}));
  a.g[1][5] = 0.5f;
  a.g[2][0] = 0.5f;
  EXPECT_FALSE(opt.step(1e-3f, a.bufs()).skipped);
  EXPECT_TRUE(opt.nonfinite_units().empty());
}

// The stop message names the step the caller numbers (the trainer's global step, which counts skipped steps), not
// the AdamW step count.
TEST(Clip, StopMessageNamesTheCallersStepNumber) {
  Model a = make_model(1.0f);
  AdamWConfig cfg;
  cfg.threads = 1;
  cfg.on_nonfinite = NonFinitePolicy::Stop;
  CpuAdamW opt(a.units, cfg);
  opt.step(1e-3f, a.bufs());
  a.g[0][3] = std::numeric_limits<float>::quiet_NaN();
  opt.set_step_number(7);
  try {
    opt.step(1e-3f, a.bufs());
    FAIL() << "expected an error";
  } catch (const lt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("at step 7;"), std::string::npos) << e.what();
  }
  EXPECT_EQ(opt.step_count(), 1);
}

TEST(Clip, CpuPartialSumMatchesDouble) {
  std::vector<float> g = randn(100003, 8);
  double ref = 0;
  for (float x : g) ref += double(x) * double(x);
  EXPECT_NEAR(grad_sumsq(g.data(), int64_t(g.size())), ref, 1e-12 * ref);
}
