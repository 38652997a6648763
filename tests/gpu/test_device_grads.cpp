// Gradients held on the device with the CUDA backend: three AdamW steps (clipping active) give the
// host-gradient run's losses, norms and weight updates within the run-to-run noise of the attention
// backward's fp32 atomics, for one and two micro-batches and a plan with CPU checkpoints. (The CPU
// suite, tests/exec/test_device_grads.cpp, checks bit-identity.)
#include <gtest/gtest.h>

#include <cmath>

#include "../exec/exec_test_util.h"
#include "backend/cuda/cuda_backend.h"
#include "exec/executor.h"
#include "exec/optim_hook.h"
#include "gpu_test_util.h"

namespace lt {
namespace {

struct Trained {
  std::vector<double> loss, norm;
  std::vector<std::vector<float>> before, after;
  int64_t host_grad_bytes = 0;
};

Trained train(const ModelConfig& c, const ExecPlan& p, int nmb, GradHome home, GradDType held = GradDType::F32) {
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(2) << 30;
  CudaBackend be(c, o);
  HostStateOptions ho;
  ho.grads = home;
  ho.grad_dtype = held;
  if (home == GradHome::Device) ho.host_grad_units = host_grad_units(c, p);
  HostState st(be, ho);
  Trained t;
  t.host_grad_bytes = st.grad_bytes();
  std::mt19937_64 rng(5);
  std::normal_distribution<float> n(0.0f, 0.05f);
  for (int64_t u = 0; u < st.units(); ++u) {
    std::vector<float> w(size_t(st.numel(u)));
    for (auto& x : w) x = n(rng);
    st.write_master(u, w.data());
    t.before.push_back(std::move(w));
  }
  OptimizerSetup os;
  os.max_grad_norm = 0.05f;
  AdamWHook hook(be.layout(), st, os);
  {
    ExecOptions eo;
    eo.micro_batches = nmb;
    Executor ex(c, be, p, st, eo);
    ex.set_update_hook(&hook);
    for (int step = 0; step < 3; ++step) {
      const test::StepBatches sb = test::step_batches(c, p, nmb, 50 + 10 * step);
      const auto& mbs = sb.mbs;
      hook.begin_step(1e-3f);
      const StepResult r = ex.train_step(mbs);
      t.loss.push_back(r.loss);
      t.norm.push_back(r.grad_norm);
    }
    ex.flush_updates();
    hook.wait_all();
  }
  for (int64_t u = 0; u < st.units(); ++u) {
    t.after.emplace_back(size_t(st.numel(u)));
    st.read_master(u, t.after.back().data());
  }
  return t;
}

// ||delta_a - delta_b|| / ||delta_a|| of the weight updates of one unit.
double update_rel_diff(const Trained& a, const Trained& b, size_t u) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.after[u].size(); ++i) {
    const double da = double(a.after[u][i]) - a.before[u][i], db = double(b.after[u][i]) - b.before[u][i];
    num += (da - db) * (da - db);
    den += da * da;
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

// 4 layers, hidden 128: large enough for bf16 tolerances to mean something.
ModelConfig small_qwen3(bool tied) {
  ModelConfig c = test::tiny_config(Arch::Qwen3, 4, tied);
  c.hidden = 128;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 64;
  c.ffn = 256;
  c.vocab = 300;
  return c;
}

struct Tolerance {
  double loss, norm, update;  // relative: loss, gradient norm, a unit's weight update
};

// d trained like h within tol; returns the worst unit's relative update difference.
double expect_like_host(const Trained& h, const Trained& d, const std::string& what, Tolerance tol) {
  EXPECT_EQ(d.host_grad_bytes, 0) << what;
  for (size_t k = 0; k < h.loss.size(); ++k) {
    EXPECT_NEAR(d.loss[k], h.loss[k], tol.loss * std::fabs(h.loss[k])) << what << " step " << k;
    EXPECT_NEAR(d.norm[k], h.norm[k], tol.norm * h.norm[k]) << what << " step " << k;
  }
  double worst = 0;
  for (size_t u = 0; u < h.after.size(); ++u) {
    const double r = update_rel_diff(h, d, u);
    EXPECT_LE(r, tol.update) << what << " unit " << u;
    worst = std::max(worst, r);
  }
  return worst;
}

TEST(GpuDeviceGrads, TrainsLikeHostGradients) {
  REQUIRE_GPU();
  const ModelConfig c = small_qwen3(true);
  double worst = 0;
  for (int nmb : {1, 2})
    for (bool offload : {false, true}) {
      ExecPlan p = ExecPlan::keep_all(c.layers, 2, 32);
      if (offload) {
        p.tier[1] = p.tier[3] = CkptTier::Cpu;
        p.tier[2] = CkptTier::None;
      }
      const std::string what = fmt::format("nmb {} {}", nmb, describe_plan(p));
      const Trained h = train(c, p, nmb, GradHome::Host), d = train(c, p, nmb, GradHome::Device);
      worst = std::max(worst, expect_like_host(h, d, what, {1e-3, 1e-2, 0.1}));
    }
  std::printf("[gpu-device-grads] worst relative difference of a unit's weight update: %.2e\n", worst);
}

// Held in bf16 (the 27B configuration: an untied embedding resident, bf16 accumulators): within bf16
// rounding of the host-gradient run, for one and two micro-batches.
TEST(GpuDeviceGrads, Bf16HeldTrainsLikeHostGradients) {
  REQUIRE_GPU();
  double worst = 0;
  for (bool tied : {true, false}) {
    const ModelConfig c = small_qwen3(tied);
    for (int nmb : {1, 2}) {
      ExecPlan p = ExecPlan::keep_all(c.layers, 2, 32);
      p.embedding_resident = true;
      const std::string what = fmt::format("tied {} nmb {}", tied, nmb);
      const Trained h = train(c, p, nmb, GradHome::Host),
                    d = train(c, p, nmb, GradHome::Device, GradDType::Bf16);
      worst = std::max(worst, expect_like_host(h, d, what, {2e-3, 2e-2, 0.15}));
    }
  }
  std::printf("[gpu-device-grads] bf16 held: worst relative difference of a unit's weight update: %.2e\n", worst);
}

}  // namespace
}  // namespace lt
