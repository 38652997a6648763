// A plan whose buffers fit the device budget runs whatever order they are taken in: the workspace is sized for
// every call of the plan and taken first (Backend::hold_workspace), at the arena's high end, so no call regrows it
// after the other buffers left the free bytes in pieces. On the CPU backend with a device budget, whose arena model
// fails where the GPU's arena would ("device arena exhausted").
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "exec/executor.h"
#include "exec_test_util.h"

namespace lt {
namespace {

// As the CUDA backend: the embedding's backward takes workspace per token of the whole micro-batch (the CUDA
// backend's sort of the ids), counted by layer_workspace_bytes only at its own rows (those of one chunk).
class SortingEmbedBackend final : public CpuBackend {
 public:
  SortingEmbedBackend(const ModelConfig& c, CpuBackendOptions o, int64_t bytes_per_token)
      : CpuBackend(c, o), per_token_(bytes_per_token) {}
  int64_t embed_workspace_bytes(int64_t tokens) const override { return tokens * per_token_; }
  int64_t layer_workspace_bytes(int64_t tokens, int64_t seq = 0) const override {
    return std::max(CpuBackend::layer_workspace_bytes(tokens, seq), embed_workspace_bytes(tokens));
  }

 private:
  int64_t per_token_;
};

CpuBackendOptions with_budget(int64_t bytes) {
  CpuBackendOptions o = test::cpu_opts();
  o.device_budget = bytes;
  return o;
}

struct StepOutcome {
  double loss = 0, grad_norm = 0, eval = 0;
  int64_t arena_peak = 0, tracked_peak = 0;
};

// One training step and one evaluation of the plan; the arena's and the budget's peaks.
StepOutcome step_and_eval(SortingEmbedBackend& be, const ModelConfig& c, const ExecPlan& p) {
  HostState st(be);
  test::random_weights(be.layout(), st, 3);
  auto b = test::random_batch(c, p.batch, p.seq, 4);
  StepOutcome o;
  {
    Executor ex(c, be, p, st);
    const StepResult r = ex.train_step({{b.ids.data(), b.targets.data(), nullptr, nullptr}});
    o.loss = r.loss;
    o.grad_norm = r.grad_norm;
    o.eval = ex.eval_loss({b.ids.data(), b.targets.data(), nullptr, nullptr});
    o.tracked_peak = r.peak_device;
  }
  o.arena_peak = be.device_arena()->peak();
  EXPECT_EQ(be.memory().current(MemKind::Device), 0) << "the executor's workspace goes with it";
  return o;
}

// The embedding's backward (tied: on the device) over the micro-batch asks more workspace than a chunk's layer and
// head calls: sized at setup for the chunks only, the workspace grew at that call, after the kept layers' buffers
// were allocated behind it, and the arena's free bytes were a hole where it was and the tail, each too small.
TEST(ArenaFragmentation, AFittingPlanRunsWhateverItsCallsAsk) {
  const ModelConfig c = test::tiny_config(Arch::Qwen2, 4, true);
  ExecPlan p = ExecPlan::keep_all(c.layers, 8, 8);
  p.chunk_samples = 1;
  p.kept_layers = 2;
  const int64_t per_token = 1024;
  // The budget: what the plan's buffers take in the arena at their peak, and a little more (less than the chunk's
  // workspace), from a run with room to spare.
  SortingEmbedBackend roomy(c, with_budget(int64_t(64) << 20), per_token);
  const StepOutcome ref = step_and_eval(roomy, c, p);
  const int64_t chunk_ws = roomy.layer_workspace_bytes(p.seq, p.seq), embed_ws = roomy.embed_workspace_bytes(8 * 8);
  ASSERT_GT(embed_ws, chunk_ws) << "the case: the embedding's call asks the most";
  EXPECT_EQ(plan_workspace_bytes(roomy, p), embed_ws);
  const int64_t budget = ref.arena_peak + 4096;
  ASSERT_LT(budget - ref.arena_peak, chunk_ws);
  EXPECT_LE(ref.tracked_peak, budget) << "the budget's totals fit";

  SortingEmbedBackend tight(c, with_budget(budget), per_token);
  StepOutcome out;
  ASSERT_NO_THROW(out = step_and_eval(tight, c, p));
  EXPECT_EQ(out.loss, ref.loss);
  EXPECT_EQ(out.grad_norm, ref.grad_norm);
  EXPECT_EQ(out.eval, ref.eval);
  EXPECT_EQ(out.arena_peak, ref.arena_peak);
}

// While an executor holds the workspace, a call that needs more is an internal error naming the call, not a
// silent regrow; once the executor is gone, the backend's ops grow it again.
TEST(ArenaFragmentation, ACallBeyondTheHeldWorkspaceIsAnInternalError) {
  const ModelConfig c = test::tiny_config(Arch::Qwen2, 2, false);
  const ExecPlan p = ExecPlan::keep_all(c.layers, 2, 8);
  CpuBackend be(c, with_budget(int64_t(16) << 20));
  HostState st(be);
  test::random_weights(be.layout(), st, 5);
  const int64_t rows = 64 * p.batch * p.seq;
  Buffer x(be, MemKind::Device, rows * c.hidden * 4, "test.x"), y(be, MemKind::Device, rows * c.hidden * 4, "test.y");
  Buffer w(be, MemKind::Device, be.layout().max_layer_numel() * 4, "test.w");
  {
    Executor ex(c, be, p, st);
    be.layer_forward(0, w.data(), DevGeometry{64 * p.batch, p.seq}, x.data(), y.data(), OpLabel{"probe", 7, 0});
    try {
      be.synchronize();
      ADD_FAILURE() << "a call beyond the held workspace ran";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("internal: layer_forward ('probe', window 7, index 0) on 1024 rows asks"), std::string::npos)
          << m;
      EXPECT_NE(m.find("but the run holds it at"), std::string::npos) << m;
    }
    be.clear_error();
  }
  const int64_t before = be.memory().current(MemKind::Device);
  be.fill_zero(Lane::Compute, x.data(), x.bytes(), {});
  be.fill_zero(Lane::Compute, w.data(), w.bytes(), {});
  be.layer_forward(0, w.data(), DevGeometry{64 * p.batch, p.seq}, x.data(), y.data(), OpLabel{"probe", 7, 0});
  ASSERT_NO_THROW(be.synchronize());
  EXPECT_EQ(be.memory().current(MemKind::Device) - before, be.layer_workspace_bytes(rows, p.seq));
}

// The GPU profiler's order (profile_gpu): a layer's call at the measured batch takes the workspace, its buffers
// go, the head's buffers (weights and fp32 gradients of a large vocabulary) are allocated, then the head's call
// asks more workspace than the layer's. With Qwen3.5-9B at batch 8 the free bytes were then in two pieces, each
// smaller than the head's workspace. Here a small model with a large vocabulary, in a budget of the sequence's
// peak and a little more.
struct LayerThenHead {
  ModelConfig c;
  int64_t batch = 4, seq = 64;

  LayerThenHead() {
    c = test::tiny_config(Arch::Qwen2, 1, false);
    c.vocab = 4096;
  }
  void run(CpuBackend& be) const {
    const int64_t T = batch * seq, H = c.hidden, V = c.vocab;
    const auto& lay = be.layout();
    auto zeroed = [&](int64_t bytes, const char* tag) {
      Allocation a = be.alloc(MemKind::Device, bytes, tag);
      be.fill_zero(Lane::Compute, a.ptr, bytes, {});
      return a;
    };
    const DevGeometry g{batch, seq};
    {
      Allocation w = zeroed(lay.layer(0).numel * 4, "profile.layer"), dw = zeroed(lay.layer(0).numel * 4, "profile.layer");
      Allocation x = zeroed(T * H * 4, "profile.layer"), y = zeroed(T * H * 4, "profile.layer");
      Allocation dx = zeroed(T * H * 4, "profile.layer");
      be.layer_backward(0, w.ptr, g, x.ptr, y.ptr, dx.ptr, dw.ptr, OpLabel{"bwd", -1, 0});
      be.synchronize();
      for (Allocation* a : {&w, &dw, &x, &y, &dx}) be.free(*a);
    }
    Allocation hw = zeroed(lay.head().numel * 4, "profile.head"), lm = zeroed(V * H * 4, "profile.head");
    Allocation x = zeroed(T * H * 4, "profile.head"), dx = zeroed(T * H * 4, "profile.head");
    Allocation dhw = zeroed(lay.head().numel * 4, "profile.head"), dlm = zeroed(V * H * 4, "profile.head");
    Allocation tg = zeroed(T * 4, "profile.head"), acc = zeroed(16, "profile.head");
    be.head_loss(hw.ptr, lm.ptr, static_cast<const int32_t*>(tg.ptr), g, x.ptr, 1.f, dx.ptr, dhw.ptr, dlm.ptr,
                 static_cast<double*>(acc.ptr), OpLabel{"head", -1, -1});
    be.synchronize();
    for (Allocation* a : {&hw, &lm, &x, &dx, &dhw, &dlm, &tg, &acc}) be.free(*a);
  }
};

TEST(ArenaFragmentation, TheWorkspaceRegrownAfterOtherBuffersFindsTheFreeSpaceInOnePiece) {
  const LayerThenHead s;
  CpuBackend roomy(s.c, with_budget(int64_t(64) << 20));
  s.run(roomy);
  const int64_t layer_ws = roomy.layer_workspace_bytes(s.batch * s.seq, 0);  // a layer's and one sample's head
  const int64_t peak = roomy.device_arena()->peak();
  ASSERT_GT(roomy.memory().peak(MemKind::Device), 0);
  const int64_t budget = peak + 16 * 1024;
  // Grown by ops as they need it (no run holds it).
  CpuBackend tight(s.c, with_budget(budget));
  EXPECT_NO_THROW(s.run(tight));
  EXPECT_EQ(tight.device_arena()->peak(), peak);
  EXPECT_GT(layer_ws, 0);
  // Held first at the largest the sequence asks (what the GPU profiler does now).
  CpuBackend held(s.c, with_budget(budget));
  held.hold_workspace(held.layer_workspace_bytes(s.batch * s.seq, s.seq));
  EXPECT_NO_THROW(s.run(held));
}

}  // namespace
}  // namespace lt
