// Budgets, instrumentation (per-window figures, trace), eval, the weight ring and the optimizer hook.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>
#include <chrono>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "exec/executor.h"
#include "exec/optim_hook.h"
#include "exec/weight_ring.h"
#include "exec_test_util.h"
#include "optim/layout_spec.h"

namespace lt {
namespace {

TEST(ExecMemory, RefusesPlanOverDeviceBudget) {
  auto c = test::tiny_config(Arch::Qwen2, 6, false);
  CpuBackendOptions bo;
  bo.device_budget = 200 * 1024;  // weights ring + boundaries of keep-all do not fit
  bo.threads = 1;
  CpuBackend be(c, bo);
  HostState st(be);
  try {
    Executor ex(c, be, ExecPlan::keep_all(c.layers, 8, 16), st);
    ADD_FAILURE() << "plan over the device budget was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit: device short by"), std::string::npos) << e.what();
  }
  EXPECT_EQ(be.memory().current(MemKind::Device), 0) << "allocations leaked after a refused plan";
}

TEST(ExecMemory, CheckpointingNeedsFewerDeviceBuffersAndPeaksAreTracked) {
  auto c = test::tiny_config(Arch::Qwen2, 8, false);
  ExecPlan all = ExecPlan::keep_all(c.layers, 2, 8);
  ExecPlan sparse = all;
  for (int64_t i = 1; i < c.layers; ++i) sparse.tier[size_t(i)] = i % 4 == 0 ? CkptTier::Gpu : CkptTier::None;
  ExecPlan cpu = all;
  for (int64_t i = 0; i < c.layers; ++i) cpu.tier[size_t(i)] = CkptTier::Cpu;
  EXPECT_EQ(count_act_buffers(all), c.layers + 2);  // x_0..x_L and dy_L at the head
  EXPECT_LT(count_act_buffers(sparse), count_act_buffers(all));
  EXPECT_LT(count_act_buffers(cpu), count_act_buffers(all));
  CpuBackend be(c, test::cpu_opts());
  HostState st(be);
  test::random_weights(be.layout(), st, 2);
  auto b = test::random_batch(c, 2, 8, 2);
  Executor ex(c, be, cpu, st);
  auto r = ex.train_step({{b.ids.data(), b.targets.data(), nullptr, nullptr}});
  EXPECT_GT(r.peak_device, 0);
  EXPECT_EQ(r.act_buffers_over_plan, 0);
  const std::string table = ex.memory_table();
  for (const char* tag : {"weights.ring", "act.boundaries", "ckpt.cpu", "host.grad", "TOTAL"})
    EXPECT_NE(table.find(tag), std::string::npos) << tag << " missing in\n" << table;
}

TEST(ExecMemory, PredictedBytesEqualAllocatedBytes) {
  std::mt19937_64 rng(5);
  auto dir = test::temp_dir("mem");
  for (bool tied : {false, true}) {
    auto c = test::tiny_config(Arch::Qwen3, 6, tied);
    for (int k = 0; k < 8; ++k) {
      ExecPlan p = test::random_plan(c.layers, 3, 8, rng);
      CpuBackend be(c, test::cpu_opts());
      HostState st(be);
      const int64_t dev0 = be.memory().current(MemKind::Device), pin0 = be.memory().current(MemKind::Pinned);
      ExecOptions o;
      o.nvme_dir = dir;
      Executor ex(c, be, p, st, o);
      const int64_t chunk = p.chunk_samples > 0 ? p.chunk_samples : p.batch;
      const auto kept = kept_internals_bytes(be, p);
      int64_t kept_sum = 0;
      for (int64_t b : kept) kept_sum += b;
      EXPECT_EQ(kept_sum > 0, p.kept_layers > 0) << describe_plan(p);
      auto m = executor_memory(c, p, be.dtypes(), be.layer_workspace_bytes(chunk * p.seq), {}, kept_sum);
      EXPECT_EQ(be.memory().current(MemKind::Device) - dev0, m.device) << describe_plan(p);
      EXPECT_EQ(be.memory().current(MemKind::Pinned) - pin0, m.pinned) << describe_plan(p);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(ExecRing, BeladyReusesResidentLayersAndPrefetches) {
  // forward 0..3, then block (0,4): recompute 0..2, backward 3..0
  std::vector<int64_t> layers = {0, 1, 2, 3, 0, 1, 2, 3, 2, 1, 0};
  std::vector<int32_t> wins(layers.size());
  for (size_t i = 0; i < wins.size(); ++i) wins[i] = int32_t(i);
  auto r2 = build_ring_schedule(layers, wins, 2);
  auto r4 = build_ring_schedule(layers, wins, 4);
  auto r3 = build_ring_schedule(layers, wins, 3);
  for (size_t u = 0; u < layers.size(); ++u) {
    if (r3.load[u] && r3.evict_after[u] >= 0) {
      EXPECT_LE(r3.evict_after[u], int64_t(u) - 3) << "load " << u;
    }
  }
  EXPECT_LT(r3.loads(), r2.loads());
  EXPECT_EQ(r4.loads(), 4);  // everything stays resident
  EXPECT_LT(r4.loads(), r2.loads());
  EXPECT_EQ(r4.load[10], 0);
  for (size_t u = 0; u < layers.size(); ++u) {
    EXPECT_EQ(r2.layer[size_t(r2.loader[u])], layers[u]);
    if (r2.load[u] && r2.evict_after[u] >= 0) {
      EXPECT_LE(r2.evict_after[u], int64_t(u) - 2) << "load " << u << " cannot be prefetched";
    }
  }
}

// A hook whose wait() blocks: the compute lane idles while the host waits, and that idle time is
// charged to the optimizer, not to transfers.
class SlowUpdateHook final : public UpdateHook {
 public:
  explicit SlowUpdateHook(double seconds) : s_(seconds) {}
  void grad_ready(int64_t, double) override {}
  void wait(int64_t) override {
    if (s_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s_));
  }

 private:
  double s_;
};

TEST(ExecInstrumentation, OptimizerWaitsAreChargedToTheOptimizer) {
  auto c = test::tiny_config(Arch::Qwen2, 4, false);
  CpuBackendOptions bo;
  bo.threads = 1;
  auto run = [&](double sleep_s) {
    CpuBackend be(c, bo);
    HostState st(be);
    test::random_weights(be.layout(), st, 8);
    ExecPlan p = ExecPlan::keep_all(c.layers, 2, 8);
    Executor ex(c, be, p, st);
    SlowUpdateHook hook(sleep_s);
    ex.set_update_hook(&hook);
    auto b = test::random_batch(c, 2, 8, 8);
    return ex.train_step({{b.ids.data(), b.targets.data(), nullptr, nullptr}});
  };
  const double sleep_s = 0.02;
  auto slow = run(sleep_s);
  // Every unit's update is awaited once per step (embedding, layers, head); the waits before a unit's
  // first use leave the compute lane idle.
  EXPECT_GT(slow.update_wait_s, double(c.layers) * sleep_s * 0.9);
  EXPECT_GT(slow.exposed_optimizer_s, sleep_s * 0.9) << "idle compute during optimizer waits";
  EXPECT_LE(slow.exposed_optimizer_s, slow.exposed_s + 1e-12);
  EXPECT_LE(slow.exposed_optimizer_s, slow.update_wait_s + 1e-3);
  double per_window = 0;
  for (auto& w : slow.windows) {
    EXPECT_LE(w.measured.exposed_optimizer, w.measured.exposed + 1e-12) << "window " << w.index;
    per_window += w.measured.exposed_optimizer;
  }
  EXPECT_NEAR(per_window, slow.exposed_optimizer_s, 1e-9);
  EXPECT_NEAR(slow.totals.exposed_optimizer, slow.exposed_optimizer_s, 1e-9);
  auto fast = run(0.0);
  EXPECT_LT(fast.exposed_optimizer_s, 0.005) << "no optimizer wait, nothing charged to it";
}

TEST(ExecInstrumentation, WindowsTraceAndExposedTime) {
  auto c = test::tiny_config(Arch::Qwen2, 4, false);
  CpuBackendOptions bo;
  bo.h2d_bytes_per_s = 20e6;  // slow "PCIe": weight uploads (~40 KB/layer) are exposed
  bo.threads = 1;
  CpuBackend be(c, bo);
  HostState st(be);
  test::random_weights(be.layout(), st, 8);
  ExecPlan p = ExecPlan::keep_all(c.layers, 2, 8);
  p.tier = {CkptTier::Gpu, CkptTier::None, CkptTier::Cpu, CkptTier::None, CkptTier::Gpu};
  p.predicted.resize(plan_windows(p).size());
  for (auto& w : p.predicted) w.exposed = 1e-3;
  Executor ex(c, be, p, st);
  auto b = test::random_batch(c, 2, 8, 8);
  auto r = ex.train_step({{b.ids.data(), b.targets.data(), nullptr, nullptr}});
  ASSERT_EQ(r.windows.size(), plan_windows(p).size());
  double h2d = 0;
  for (auto& w : r.windows) {
    EXPECT_GT(w.measured.compute, 0) << "window " << w.index;
    EXPECT_GE(w.t_end, w.t_begin);
    EXPECT_DOUBLE_EQ(w.predicted.exposed, 1e-3);
    h2d += w.measured.h2d;
  }
  EXPECT_GT(h2d, 0.005);
  EXPECT_NEAR(r.totals.h2d, h2d, 1e-9);
  EXPECT_NEAR(r.totals.exposed, r.exposed_s, 1e-9);
  EXPECT_GT(r.exposed_s, 0.001) << "slow uploads must show as exposed time";
  EXPECT_NEAR(r.predicted_exposed_s, 1e-3 * double(r.windows.size()), 1e-9);
  const std::string table = ex.window_table(r);
  EXPECT_NE(table.find("recompute"), std::string::npos) << table;
  auto path = test::temp_dir("trace") / "step.json";
  ex.write_trace(path);
  std::ifstream f(path);
  auto j = nlohmann::json::parse(f);
  std::set<int> tids;
  int n_fwd = 0;
  for (auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") tids.insert(e["tid"].get<int>());
    if (e["ph"] == "X" && e["name"].get<std::string>().rfind("fwd", 0) == 0) ++n_fwd;
  }
  EXPECT_TRUE(tids.count(0) && tids.count(1) && tids.count(2)) << "compute, h2d and d2h tracks expected";
  int n_windows = 0;
  for (auto& e : j["traceEvents"]) n_windows += e["ph"] == "X" && e["cat"] == "windows";
  EXPECT_EQ(n_windows, int(r.windows.size()));
  EXPECT_EQ(n_fwd, c.layers);
  std::filesystem::remove_all(path.parent_path());
}

TEST(ExecEval, EvalLossEqualsTrainLossAndLeavesGradsAlone) {
  auto c = test::tiny_config(Arch::Llama, 3, true);
  CpuBackend be(c, test::cpu_opts());
  HostState st(be);
  test::random_weights(be.layout(), st, 12);
  ExecPlan p = ExecPlan::keep_all(c.layers, 2, 8);
  p.tier[1] = CkptTier::None;
  Executor ex(c, be, p, st);
  auto b = test::random_batch(c, 2, 8, 13);
  int64_t n = 0;
  const double e = ex.eval_loss({b.ids.data(), b.targets.data(), nullptr, nullptr}, &n);
  auto r = ex.train_step({{b.ids.data(), b.targets.data(), nullptr, nullptr}});
  EXPECT_EQ(n, r.n_tokens);
  EXPECT_EQ(e, r.loss);
}

TEST(ExecOptimizer, AdamWHookUpdatesLikeTheSynchronousOptimizer) {
  auto c = test::tiny_config(Arch::Qwen2, 3, false);
  auto b = test::random_batch(c, 2, 8, 17);
  MicroBatch mb{b.ids.data(), b.targets.data(), nullptr, nullptr};
  auto specs = [&](const ModelLayout& lay) {
    std::vector<optim::UnitSpec> v;
    for (auto& u : lay.units) v.push_back(optim::unit_spec_from_layout(u, optim::OptimizerKind::AdamW));
    return v;
  };
  optim::AdamWConfig oc;
  oc.max_grad_norm = 0.05f;  // clipping active
  oc.threads = 1;
  // Executor + hook, two steps (the second step's forward waits for the first step's updates).
  CpuBackend be(c, test::cpu_opts());
  HostState st(be);
  test::random_weights(be.layout(), st, 4);
  optim::CpuAdamW opt(specs(be.layout()), oc);
  AdamWHook hook(opt, st);
  ExecPlan p = ExecPlan::keep_all(c.layers, 2, 8);
  p.tier[1] = CkptTier::Cpu;
  p.tier[2] = CkptTier::None;
  Executor ex(c, be, p, st);
  ex.set_update_hook(&hook);
  // Reference: same executor math without the hook, then the synchronous optimizer.
  CpuBackend be2(c, test::cpu_opts());
  HostState st2(be2);
  test::random_weights(be2.layout(), st2, 4);
  optim::CpuAdamW opt2(specs(be2.layout()), oc);
  Executor ex2(c, be2, ExecPlan::keep_all(c.layers, 2, 8), st2);
  for (int step = 0; step < 2; ++step) {
    opt.begin_step(1e-2f);
    auto r = ex.train_step({mb});
    auto r2 = ex2.train_step({mb});
    EXPECT_EQ(r.loss, r2.loss) << "step " << step;
    std::vector<optim::UnitBuffers> bufs;
    for (int64_t u = 0; u < st2.units(); ++u) bufs.push_back({st2.master(u), st2.grad(u), nullptr});
    auto info = opt2.step(1e-2f, bufs);
    EXPECT_LT(info.clip_coef, 1.0f);
  }
  for (int64_t u = 0; u < st.units(); ++u) opt.wait(int(u));
  for (int64_t u = 0; u < st.units(); ++u)
    EXPECT_EQ(std::memcmp(st.master(u), st2.master(u), size_t(st.numel(u)) * 4), 0) << "unit " << u;
}

}  // namespace
}  // namespace lt

namespace lt {
namespace {

std::string plan_error(const ExecPlan& p, int64_t L) {
  try {
    validate_plan(p, L);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The CPU backend's kept buffer records its forward: a kept backward of another layer, or a second one without a
// new forward, is an error (what makes the executor's kept path checkable on the CPU).
TEST(ExecKept, CpuBackendRejectsAWrongOrStaleKeptBuffer) {
  auto c = test::tiny_config(Arch::Qwen2, 3, false);
  CpuBackend be(c, test::cpu_opts());
  HostState st(be);
  test::random_weights(be.layout(), st, 3);
  const int64_t T = 8, H = c.hidden;
  std::vector<float> x(size_t(T * H), 0.5f), y(x.size()), dy(x.size(), 0.1f), dx(x.size());
  std::vector<float> dw(size_t(be.layout().layer(1).numel));
  std::vector<char> keep(size_t(be.layer_keep_bytes(1, 1, T)));
  const DevGeometry g{1, T, nullptr, nullptr};
  be.layer_forward_keep(1, st.stream(2), g, x.data(), y.data(), keep.data(), {});
  be.layer_backward_kept(1, st.stream(2), g, x.data(), dy.data(), dx.data(), dw.data(), keep.data(), {});
  EXPECT_NO_THROW(be.synchronize());
  be.layer_backward_kept(1, st.stream(2), g, x.data(), dy.data(), dx.data(), dw.data(), keep.data(), {});
  try {
    be.synchronize();
    ADD_FAILURE() << "a consumed kept buffer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_backward_kept of layer 1"), std::string::npos) << e.what();
  }
  be.clear_error();
  be.layer_forward_keep(1, st.stream(2), g, x.data(), y.data(), keep.data(), {});
  be.layer_backward_kept(2, st.stream(3), g, x.data(), dy.data(), dx.data(), dw.data(), keep.data(), {});
  EXPECT_THROW(be.synchronize(), Error);
  be.clear_error();
}

TEST(ExecPlanValidation, RejectsInvalidPlansWithClearMessages) {
  const int64_t L = 4;
  ExecPlan ok = ExecPlan::keep_all(L, 2, 8);
  EXPECT_EQ(plan_error(ok, L), "");
  ExecPlan p = ok;
  p.kept_layers = L + 1;
  EXPECT_NE(plan_error(p, L).find("'kept_layers' is 5, expected 0..4"), std::string::npos) << plan_error(p, L);
  p = ok;
  p.tier.pop_back();
  EXPECT_NE(plan_error(p, L).find("'tier' has 4 boundaries, expected layers+1 = 5"), std::string::npos);
  p = ok;
  p.tier[0] = CkptTier::None;
  EXPECT_NE(plan_error(p, L).find("boundary 0 must be materialised"), std::string::npos);
  p = ok;
  p.ring = 1;
  EXPECT_NE(plan_error(p, L).find("'ring' is 1"), std::string::npos);
  p = ok;
  p.tier[2] = CkptTier::Cpu;
  p.traffic.resize(size_t(L + 1));
  p.traffic[2].d2h = {{1, 1.0}};  // before the boundary exists
  EXPECT_NE(plan_error(p, L).find("boundary 2: d2h share in window 1, expected [2, 4]"), std::string::npos)
      << plan_error(p, L);
  p.traffic[2].d2h = {{2, 0.5}, {3, 0.4}};
  EXPECT_NE(plan_error(p, L).find("fractions sum to 0.9"), std::string::npos) << plan_error(p, L);
  p.traffic[2].d2h = {{2, 1.0}};
  p.traffic[2].h2d = {{9, 1.0}};  // after its block started
  EXPECT_NE(plan_error(p, L).find("h2d share in window 9"), std::string::npos) << plan_error(p, L);
  p.traffic[2].h2d = {};
  EXPECT_EQ(plan_error(p, L), "");
}

}  // namespace
}  // namespace lt

namespace lt {
namespace {

// The host embedding gradient (untied, not resident) over several steps whose batches hit different rows: with the
// nonzero rows tracked (a hook that leaves host gradients alone) each step visits only the rows it or the previous
// step hit, and the gradient and its sum of squares are those of the full pass (a hook that rewrites them), bit
// for bit.
struct NullHook final : UpdateHook {
  bool rewrites = false;
  void grad_ready(int64_t, double) override {}
  void wait(int64_t) override {}
  bool rewrites_host_gradients() const override { return rewrites; }
};

TEST(ExecHostEmbedding, TrackedRowsEqualTheFullPass) {
  auto c = test::tiny_config(Arch::Qwen2, 3, false);
  ExecPlan p = ExecPlan::keep_all(c.layers, 2, 8);
  p.embedding_resident = false;
  std::vector<std::vector<float>> grads[2];
  std::vector<double> sumsq[2];
  for (int full = 0; full < 2; ++full) {
    CpuBackend be(c, test::cpu_opts());
    HostState st(be);
    test::random_weights(be.layout(), st, 4);
    NullHook hook;
    hook.rewrites = full == 1;
    Executor ex(c, be, p, st);
    ex.set_update_hook(&hook);
    for (uint64_t step = 0; step < 3; ++step) {
      auto b = test::random_batch(c, 2, 8, 40 + step);
      ex.train_step({MicroBatch{b.ids.data(), b.targets.data(), nullptr, nullptr}});
      grads[full].emplace_back(st.grad(0), st.grad(0) + st.numel(0));
      sumsq[full].push_back(st.sumsq(0));
    }
  }
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(grads[0][s], grads[1][s]) << "step " << s;
    EXPECT_EQ(sumsq[0][s], sumsq[1][s]) << "step " << s;
  }
  // The batches hit different rows: a row hit in step 0 only is zero again after step 1.
  auto b0 = test::random_batch(c, 2, 8, 40), b1 = test::random_batch(c, 2, 8, 41);
  int checked = 0;
  for (int32_t r : b0.ids)
    if (std::find(b1.ids.begin(), b1.ids.end(), r) == b1.ids.end() && checked++ < 3)
      for (int64_t k = 0; k < c.hidden; ++k) EXPECT_EQ(grads[0][1][size_t(r * c.hidden + k)], 0.0f) << "row " << r;
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace lt

namespace lt {
namespace {

// Forwards to an AdamWHook and counts the lookups that waited only for the hinted rows.
struct CountingHook final : UpdateHook {
  AdamWHook& h;
  int first_waits = 0;
  explicit CountingHook(AdamWHook& x) : h(x) {}
  void grad_ready(int64_t u, double s) override { h.grad_ready(u, s); }
  void wait(int64_t u) override { h.wait(u); }
  void prioritize(int64_t u, std::vector<std::pair<int64_t, int64_t>> r) override { h.prioritize(u, std::move(r)); }
  void wait_first(int64_t u) override {
    ++first_waits;
    h.wait_first(u);
  }
};

// The next step's embedding rows first (set_next_step_ids, host lookup): the same losses and masters as without the
// hint, bit for bit, and the later steps' lookups wait only for those rows.
TEST(ExecOptimizer, NextStepRowsFirstChangeNothing) {
  auto c = test::tiny_config(Arch::Qwen2, 3, false);
  c.vocab = 200;  // rows the batches do not hit
  std::vector<test::Batch> batches;
  for (uint64_t s = 0; s < 4; ++s) batches.push_back(test::random_batch(c, 2, 8, 60 + s));
  std::vector<std::vector<float>> masters[2];
  std::vector<double> losses[2], evals[2];
  int first_waits = 0;
  for (int hint = 0; hint < 2; ++hint) {
    CpuBackend be(c, test::cpu_opts());
    HostState st(be);
    test::random_weights(be.layout(), st, 4);
    std::vector<optim::UnitSpec> specs;
    for (auto& u : be.layout().units) specs.push_back(optim::unit_spec_from_layout(u, optim::OptimizerKind::AdamW));
    optim::AdamWConfig oc;
    oc.threads = 2;
    oc.chunk_elems = 256;  // many work items: the hinted rows really go first
    optim::CpuAdamW opt(specs, oc);
    AdamWHook inner(opt, st);
    CountingHook hook(inner);
    ExecPlan p = ExecPlan::keep_all(c.layers, 2, 8);
    p.embedding_resident = false;
    Executor ex(c, be, p, st);
    ex.set_update_hook(&hook);
    EXPECT_TRUE(ex.wants_next_step_ids());
    for (size_t s = 0; s < batches.size(); ++s) {
      opt.begin_step(1e-2f);
      if (hint && s + 1 < batches.size()) ex.set_next_step_ids(batches[s + 1].ids);
      const auto& b = batches[s];
      const MicroBatch mb{b.ids.data(), b.targets.data(), nullptr, nullptr};
      losses[hint].push_back(ex.train_step({mb}).loss);
      // An evaluation between steps reads the whole updated table (its rows are not the hinted ones).
      evals[hint].push_back(ex.eval_loss(mb));
    }
    for (int64_t u = 0; u < st.units(); ++u) opt.wait(int(u));
    for (int64_t u = 0; u < st.units(); ++u) masters[hint].emplace_back(st.master(u), st.master(u) + st.numel(u));
    if (hint) first_waits = hook.first_waits;
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(evals[0], evals[1]);
  for (size_t u = 0; u < masters[0].size(); ++u) EXPECT_EQ(masters[0][u], masters[1][u]) << "unit " << u;
  EXPECT_EQ(first_waits, 3);  // steps 2-4 looked up rows hinted by the step before
}

}  // namespace
}  // namespace lt
