// Plan invariance on the GPU: the layer-streaming executor with the CUDA backend gives, for random
// valid plans (GPU/CPU/NVMe tiers, recompute blocks, chunk sizes, ring sizes, transfer shares), the
// keep-everything plan's loss and gradients within bf16 tolerance (not bit-identical: the attention
// backward adds dQ with fp32 atomics, and chunking changes the order of weight-gradient sums).
#include <gtest/gtest.h>

#include <cmath>

#include "../exec/exec_test_util.h"
#include "backend/cuda/cuda_backend.h"
#include "exec/executor.h"
#include "gpu_test_util.h"

namespace lt {
namespace {

struct Out {
  double loss = 0;
  int64_t n_tokens = 0;
  std::vector<std::vector<float>> grads;
};

ModelConfig gpu_config(Arch arch, bool tied) {
  ModelConfig c = test::tiny_config(arch, 6, tied);
  c.hidden = 128;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 64;  // the tensor-core attention kernels
  c.ffn = 256;
  c.vocab = 300;
  if (arch == Arch::Qwen3_5) c.linear = LinearAttnConfig{2, 4, 32, 32, 4};  // the GPU kernels' head dims
  return c;
}

// mlp_bound > 0: every layer call's MLP in passes of at most that many rows (CudaBackend::set_mlp_pass_bound).
Out run(const ModelConfig& c, const ExecPlan& plan, const test::Batch& b, const std::filesystem::path& nvme,
        int64_t mlp_bound = 0) {
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(2) << 30;
  CudaBackend be(c, o);
  if (mlp_bound > 0) be.set_mlp_pass_bound(mlp_bound);
  HostState st(be);
  test::random_weights(be.layout(), st, 9);
  ExecOptions eo;
  eo.nvme_dir = nvme;
  Executor ex(c, be, plan, st, eo);
  MicroBatch mb{b.ids.data(), b.targets.data(), b.positions.empty() ? nullptr : b.positions.data(),
                b.segments.empty() ? nullptr : b.segments.data()};
  StepResult r = ex.train_step({mb});
  Out out;
  out.loss = r.loss;
  out.n_tokens = r.n_tokens;
  for (int64_t u = 0; u < st.units(); ++u) out.grads.emplace_back(st.grad(u), st.grad(u) + st.numel(u));
  return out;
}

struct Worst {
  double cos = 1, loss = 0;
  int n = 0;
};

// Random plans of the model against its keep-everything plan.
void check_random_plans(const ModelConfig& c, Arch arch, bool tied, std::mt19937_64& rng,
                        const std::filesystem::path& dir, Worst& w, int64_t mlp_bound = 0) {
  const int64_t B = 4, S = 40;
  auto b = test::random_batch(c, B, S, 3 + uint64_t(tied), arch != Arch::Qwen2);
  const Out base = run(c, ExecPlan::keep_all(c.layers, B, S), b, {});
  for (int k = 0; k < 6; ++k) {
    ExecPlan p = test::random_plan(c.layers, B, S, rng);
    const Out o = run(c, p, b, dir, mlp_bound);
    const std::string what = describe_plan(p);
    EXPECT_EQ(o.n_tokens, base.n_tokens) << what;
    const double dl = std::fabs(o.loss - base.loss) / std::fabs(base.loss);
    EXPECT_LE(dl, 1e-3) << what;
    w.loss = std::max(w.loss, dl);
    for (size_t u = 0; u < o.grads.size(); ++u) {
      const double cs = gputest::cosine(o.grads[u].data(), base.grads[u].data(), o.grads[u].size());
      EXPECT_GE(cs, 0.999) << what << ": unit " << u;
      w.cos = std::min(w.cos, cs);
    }
    ++w.n;
  }
}

TEST(GpuPlanInvariance, RandomPlansWithinBf16Tolerance) {
  REQUIRE_GPU();
  std::mt19937_64 rng(77);
  auto dir = test::temp_dir("gpuinv");
  Worst w;
  for (auto arch : {Arch::Qwen2, Arch::Qwen3})
    for (bool tied : {false, true}) check_random_plans(gpu_config(arch, tied), arch, tied, rng, dir, w);
  std::printf("[gpu-plan-invariance] %d random plans: worst loss rel diff %.2e, worst unit gradient cosine %.6f\n", w.n,
              w.loss, w.cos);
  std::filesystem::remove_all(dir);
}

// The MLP in passes of 24 rows (long-sequence execution, mlp_pass_rows) under random plans: the keep-everything plan
// in one pass per call is the reference.
TEST(GpuPlanInvariance, RandomPlansInMlpPassesWithinBf16Tolerance) {
  REQUIRE_GPU();
  std::mt19937_64 rng(81);
  auto dir = test::temp_dir("gpuinvmlp");
  Worst w;
  for (auto arch : {Arch::Qwen3, Arch::Qwen3_5})
    check_random_plans(gpu_config(arch, false), arch, false, rng, dir, w, 24);
  std::printf("[gpu-plan-invariance] MLP passes of 24 rows: %d random plans: worst loss rel diff %.2e, worst unit "
              "gradient cosine %.6f\n", w.n, w.loss, w.cos);
  std::filesystem::remove_all(dir);
}

// A tiny Qwen3.5 hybrid (Gated DeltaNet and gated attention layers, not in a 3:1 order; packed rows).
TEST(HybridGpuPlanInvariance, RandomPlansWithinBf16Tolerance) {
  REQUIRE_GPU();
  std::mt19937_64 rng(79);
  auto dir = test::temp_dir("gpuinv35");
  Worst w;
  for (bool tied : {false, true}) check_random_plans(gpu_config(Arch::Qwen3_5, tied), Arch::Qwen3_5, tied, rng, dir, w);
  std::printf("[gpu-plan-invariance] hybrid: %d random plans: worst loss rel diff %.2e, worst unit gradient cosine "
              "%.6f\n", w.n, w.loss, w.cos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lt
