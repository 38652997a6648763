// The embedding's update on the GPU (exec/device_update.h) with the CUDA backend: the kernel is the CPU optimizer's
// fp32 arithmetic bit for bit on the split master (and on an fp32 one), and three AdamW steps of a tied model with
// the update on the device give the CPU optimizer's losses, norms, weights and moments within the run-to-run noise
// of the backward's fp32 atomics (the CPU suite, tests/exec/test_device_update.cpp, checks bit-identity of the path).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "../exec/exec_test_util.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "core/split_master.h"
#include "exec/executor.h"
#include "exec/optim_hook.h"
#include "gpu_test_util.h"
#include "optim/adamw_kernels.h"

namespace lt {
namespace {

using gputest::DevBuf;

TEST(GpuDeviceUpdate, KernelIsTheCpuOptimizersArithmeticBitForBit) {
  REQUIRE_GPU();
  std::mt19937 rng(7);
  const size_t n = (size_t(1) << 22) + 17;  // past the grid-stride bound, a ragged tail
  const auto p = gputest::randn(n, rng, 0.05f), g = gputest::randn(n, rng, 1e-2f), m = gputest::randn(n, rng, 1e-3f);
  auto v = gputest::randn(n, rng, 1e-6f);
  for (auto& x : v) x = std::fabs(x);
  for (int step : {1, 9}) {
    const optim::AdamWScalars s = optim::make_adamw_scalars(3e-4, 0.1, 0.9, 0.999, 1e-8, step, 0.43f);
    const AdamWStepScalars d = device_scalars(s);
    const cuda::AdamWConsts c{s.decay, s.w1, s.beta2, s.w2, s.eps, s.bc2_sqrt, s.neg_step_size, s.grad_scale};
    for (bool split : {true, false}) {
      std::vector<uint16_t> hi(n), lo(n);
      for (size_t i = 0; i < n; ++i) split_master(p[i], &hi[i], &lo[i]);
      std::vector<float> pr = p, mr = m, vr = v;  // the CPU reference
      std::vector<uint16_t> hr = hi, lr = lo;
      if (split) cpu::adamw_step(d, nullptr, hr.data(), lr.data(), g.data(), mr.data(), vr.data(), int64_t(n));
      else cpu::adamw_step(d, pr.data(), nullptr, nullptr, g.data(), mr.data(), vr.data(), int64_t(n));
      DevBuf dp = gputest::up(p), dh = gputest::up(hi), dl = gputest::up(lo), dg = gputest::up(g), dm = gputest::up(m),
             dv = gputest::up(v);
      if (split)
        cuda::adamw_step(c, nullptr, dh.as<uint16_t>(), dl.as<uint16_t>(), dg.as<float>(), dm.as<float>(),
                         dv.as<float>(), int64_t(n), nullptr);
      else
        cuda::adamw_step(c, dp.as<float>(), nullptr, nullptr, dg.as<float>(), dm.as<float>(), dv.as<float>(),
                         int64_t(n), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::string what = fmt::format("step {} split {}", step, split);
      if (split) {
        EXPECT_EQ(gputest::down<uint16_t>(dh.p, n), hr) << what;
        EXPECT_EQ(gputest::down<uint16_t>(dl.p, n), lr) << what;
        EXPECT_NE(hr, hi) << what;
      } else {
        const auto pg = gputest::down<float>(dp.p, n);
        EXPECT_EQ(std::memcmp(pg.data(), pr.data(), n * 4), 0) << what;
      }
      const auto mg = gputest::down<float>(dm.p, n), vg = gputest::down<float>(dv.p, n);
      EXPECT_EQ(std::memcmp(mg.data(), mr.data(), n * 4), 0) << what;
      EXPECT_EQ(std::memcmp(vg.data(), vr.data(), n * 4), 0) << what;
    }
  }
}

struct Trained {
  std::vector<double> loss, norm;
  std::vector<std::vector<float>> after;
  std::vector<float> m0, v0;
  int64_t device_peak = 0;
};

Trained train(const ModelConfig& c, const ExecPlan& p, int nmb, bool on_device) {
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(2) << 30;
  CudaBackend be(c, o);
  HostStateOptions ho;
  ho.embedding_update_device = on_device;
  HostState st(be, ho);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (int64_t u = 0; u < st.units(); ++u) {
    std::vector<float> w(size_t(st.numel(u)));
    for (auto& x : w) x = nd(rng);
    st.write_master(u, w.data());
  }
  OptimizerSetup os;
  os.max_grad_norm = 0.05f;
  os.weight_decay = 0.1f;
  AdamWHook hook(be.layout(), st, os);
  Trained t;
  {
    ExecOptions eo;
    eo.micro_batches = nmb;
    Executor ex(c, be, p, st, eo);
    ex.set_update_hook(&hook);
    for (int step = 0; step < 3; ++step) {
      const test::StepBatches sb = test::step_batches(c, p, nmb, 50 + 10 * step);
      const auto& mbs = sb.mbs;
      hook.begin_step(1e-3f * float(step + 1));
      const StepResult r = ex.train_step(mbs);
      t.loss.push_back(r.loss);
      t.norm.push_back(r.grad_norm);
      t.device_peak = std::max(t.device_peak, r.peak_device);
    }
    ex.flush_updates();
    hook.wait_all();
  }
  for (int64_t u = 0; u < st.units(); ++u) {
    t.after.emplace_back(size_t(st.numel(u)));
    st.read_master(u, t.after.back().data());
  }
  hook.optimizer().read_state(0, 0, t.m0, t.v0);
  return t;
}

double rel(const std::vector<float>& a, const std::vector<float>& ref) { return gputest::rel_err(a, ref); }

TEST(GpuDeviceUpdate, TrainsLikeTheCpuOptimizer) {
  REQUIRE_GPU();
  ModelConfig c = test::tiny_config(Arch::Qwen3, 4, true);
  c.hidden = 128, c.heads = 2, c.kv_heads = 1, c.head_dim = 64, c.ffn = 256, c.vocab = 300;
  for (int nmb : {1, 2}) {
    const ExecPlan p = ExecPlan::keep_all(c.layers, 2, 32);
    const Trained h = train(c, p, nmb, false), d = train(c, p, nmb, true);
    const std::string what = fmt::format("nmb {}", nmb);
    for (size_t k = 0; k < h.loss.size(); ++k) {
      EXPECT_NEAR(d.loss[k], h.loss[k], 1e-4 * std::fabs(h.loss[k])) << what << " step " << k;
      EXPECT_NEAR(d.norm[k], h.norm[k], 1e-3 * h.norm[k]) << what << " step " << k;
    }
    for (size_t u = 0; u < h.after.size(); ++u) EXPECT_LT(rel(d.after[u], h.after[u]), 1e-4) << what << " unit " << u;
    EXPECT_LT(rel(d.m0, h.m0), 1e-3) << what;
    EXPECT_LT(rel(d.v0, h.v0), 1e-3) << what;
    double msum = 0;
    for (float x : d.m0) msum += std::fabs(x);
    EXPECT_GT(msum, 0) << what << ": the moments came back";
    std::printf("[gpu-device-update] nmb %d: emb weights rel %.2e, m rel %.2e, v rel %.2e; device peak %+lld B\n", nmb,
                rel(d.after[0], h.after[0]), rel(d.m0, h.m0), rel(d.v0, h.v0),
                (long long)(d.device_peak - h.device_peak));
  }
}

}  // namespace
}  // namespace lt
