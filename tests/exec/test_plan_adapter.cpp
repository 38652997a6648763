// Plans made by the planner (src/plan) run on the executor: heuristics, the planner's own choice, and
// NVMe tiers with the planner's tied traffic windows; all bit-identical to keep-everything.
#include "../common/repo_path.h"
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "exec/executor.h"
#include "exec/plan_adapter.h"
#include "exec_test_util.h"
#include "plan/heuristics.h"
#include "plan/planner.h"
#include "plan/profile.h"

namespace lt {
namespace {

std::vector<std::vector<float>> grads_of(const ModelConfig& c, const ExecPlan& p, const test::Batch& b,
                                          const std::filesystem::path& nvme, double* loss) {
  CpuBackend be(c, test::cpu_opts());
  HostState st(be);
  test::random_weights(be.layout(), st, 99);
  ExecOptions o;
  o.nvme_dir = nvme;
  Executor ex(c, be, p, st, o);
  auto r = ex.train_step({{b.ids.data(), b.targets.data(), nullptr, nullptr}});
  *loss = r.loss;
  EXPECT_EQ(r.windows.size(), p.predicted.empty() ? r.windows.size() : p.predicted.size());
  std::vector<std::vector<float>> g;
  for (int64_t u = 0; u < st.units(); ++u) g.emplace_back(st.grad(u), st.grad(u) + st.numel(u));
  return g;
}

TEST(ExecPlanAdapter, PlannerPlansRunBitIdentical) {
  auto c = test::tiny_config(Arch::Qwen2, 8, true);
  const int64_t B = 2, S = 16;
  auto b = test::random_batch(c, B, S, 5);
  double base_loss = 0;
  auto base = grads_of(c, ExecPlan::keep_all(c.layers, B, S), b, {}, &base_loss);
  auto dir = test::temp_dir("adapter");
  PlanRequest rq;
  rq.model = c;
  rq.batch = B;
  rq.seq = S;
  rq.profile = resolve_profile(lt::testing::repo_root().string() + "/configs/profiles/h200.json");
  rq.profile.nvme_dir = dir.string();
  rq.compare = false;
  rq.milp.time_limit_s = 2;
  for (std::string planner : {"megatrain:3", "cpu-all", "sqrt", "dp"}) {
    rq.planner = planner;
    auto out = make_plan(rq);
    ASSERT_TRUE(out.feasible) << planner << ": " << out.why;
    ExecPlan p = exec_plan_from(out.plan, c);
    double loss = 0;
    auto g = grads_of(c, p, b, dir, &loss);
    EXPECT_EQ(loss, base_loss) << planner;
    for (size_t u = 0; u < g.size(); ++u)
      EXPECT_EQ(std::memcmp(g[u].data(), base[u].data(), g[u].size() * 4), 0) << planner << " unit " << u;
    // Same plan with NVMe tiers where the tied rule allows them.
    Plan np = out.plan;
    const auto ck = plan_checkpoints(np);
    for (size_t k = 0; k + 1 < ck.size(); ++k)
      if (ck[k] > 0 && tied_nvme_ok(int(c.layers), ck[k], ck[k + 1])) np.tier[size_t(ck[k])] = Tier::Nvme;
    np.blocks = blocks_from_tiers(np.tier);
    np.traffic.clear();
    assign_tied_traffic(out.inst, np);
    np.predicted.windows.clear();
    ExecPlan pn = exec_plan_from(np, c);
    g = grads_of(c, pn, b, dir, &loss);
    EXPECT_EQ(loss, base_loss) << planner << " +nvme";
    for (size_t u = 0; u < g.size(); ++u)
      EXPECT_EQ(std::memcmp(g[u].data(), base[u].data(), g[u].size() * 4), 0) << planner << " +nvme unit " << u;
  }
  std::filesystem::remove_all(dir);
}

TEST(ExecPlanAdapter, RejectsPlanForAnotherModel) {
  auto c = test::tiny_config(Arch::Qwen2, 4, false);
  Plan p;
  p.layers = 5;
  p.hidden = c.hidden;
  p.vocab = c.vocab;
  p.batch = 1;
  p.seq = 8;
  p.chunk = 1;
  p.tier.assign(6, Tier::Gpu);
  p.blocks = blocks_from_tiers(p.tier);
  try {
    exec_plan_from(p, c);
    ADD_FAILURE() << "mismatched plan accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("5 layers"), std::string::npos) << e.what();
  }
}

// The planner's predicted GPU peak covers what the executor allocates for the plan (outside the backend's one
// workspace, which the slots' working sets hold): real shapes on the CUDA backend's dtypes (bf16 weights and
// activations, fp32 gradients), up to the largest batch at the cap. Measured on the H200: the Qwen3.5-9B plan at its largest
// batch (1,067) predicted 76.96 GiB where the executor asked 83.16 GiB (fp32 gradient buffers and the head's
// weights outside the model), and the run failed at allocation.
TEST(PlanAdapter, PredictedPeakCoversTheExecutorsDeviceMemory) {
  const auto prof = resolve_profile(lt::testing::repo_root().string() + "/configs/profiles/measured-h200.json");
  int planned = 0;
  for (const char* model : {"qwen3.5-9b", "qwen2.5-7b"})
    for (int64_t batch : {8, 64, 900}) {
      SCOPED_TRACE(std::string(model) + " batch " + std::to_string(batch));
      PlanRequest r;
      r.model = preset_config(model);
      r.batch = batch;
      r.profile = prof;
      r.profile.hbm_bytes = int64_t(80) << 30;
      r.profile.dram_bytes = int64_t(104) << 30;
      r.profile.nvme_bytes = 0;
      r.optimizer = "adamw8bit";
      r.compare = false;
      r.explain = false;
      const PlanOutcome o = make_plan(r);
      if (!o.feasible) continue;
      ++planned;
      const ExecPlan ex = exec_plan_from(o.plan, r.model);
      const BackendDTypes cuda{DType::BF16, DType::BF16, DType::F32};
      const auto m = executor_memory(r.model, ex, cuda, 0,
                                     {.home = o.placement.grads, .dtype = o.placement.grad_dtype,
                                      .ring_depth = o.placement.grad_ring_depth,
                                      .head_slices = o.placement.head_grad_slices});
      EXPECT_LE(double(m.device), double(o.sim.pred.peak_hbm)) << describe_plan(ex);
      EXPECT_LE(double(o.sim.pred.peak_hbm), o.inst.hbm_cap + 0.5);
    }
  EXPECT_EQ(planned, 6);  // every one fits (900 samples: chunked, CPU-tier checkpoints and recompute)
}

}  // namespace
}  // namespace lt
