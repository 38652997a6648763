// Gradients held on the device (GradHome::Device, exec/grad_stream.h): training through AdamWHook gives
// the same losses, norms and master weights as host gradients, bit for bit, across micro-batch counts,
// tied/untied and host/device embeddings and offloaded checkpoints; memory is where it should be; a
// failed step (while the previous step's gradients stream), an eval in between and destroying the
// executor without a flush lose nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "exec/executor.h"
#include "exec/optim_hook.h"
#include "exec_test_util.h"

namespace lt {
namespace {

struct Outcome {
  std::vector<double> loss, norm, opt_norm, eval;
  std::vector<std::vector<float>> masters;
  int64_t grad_bytes = 0, peak_device = 0, failures = 0, pinned = 0;
  bool host_bf16_grads = false;
};

// Called before step s; returns true when that step is expected to fail (it is then run again).
using BeforeStep = std::function<bool(CpuBackend&, Executor&, int)>;

struct Case {
  ModelConfig c;
  ExecPlan p;
  int nmb = 1;
  int steps = 4;
  bool eval_after_step_1 = false;
  bool flush = true;  // flush_updates before wait_all (false: the executor's destructor does it)
  bool round_host_embedding = false;  // round_host_grads: the host-computed embedding's gradient too
  int ring_depth = kGradRingDepth;    // the held gradients' staging ring (HostStateOptions::grad_ring_depth)
  int64_t head_slice_rows = 0;        // > 0: the head's gradient by vocabulary slices of this many rows
};

std::vector<optim::UnitSpec> unit_specs(const ModelLayout& lay) {
  std::vector<optim::UnitSpec> v;
  for (auto& u : lay.units) v.push_back(optim::unit_spec_from_layout(u, optim::OptimizerKind::AdamW));
  return v;
}

// Host gradients rounded to bf16 before the update, the sum of squares taken over the rounded values:
// what gradients held on the device in bf16 give with one micro-batch, formed the host's way. Units in
// `keep` (the host-computed embedding, fp32 in both) pass through.
class RoundToBf16Hook final : public UpdateHook {
 public:
  RoundToBf16Hook(UpdateHook& inner, HostState& st, std::vector<int64_t> keep)
      : inner_(inner), st_(st), keep_(std::move(keep)) {}
  void grad_ready(int64_t unit, double sumsq) override {
    if (std::find(keep_.begin(), keep_.end(), unit) == keep_.end()) {
      float* g = st_.grad(unit);
      sumsq = 0;
      for (int64_t i = 0; i < st_.numel(unit); ++i) {
        g[i] = bf16_to_f32(f32_to_bf16(g[i]));
        sumsq += double(g[i]) * double(g[i]);
      }
    }
    inner_.grad_ready(unit, sumsq);
  }
  void wait(int64_t unit) override { inner_.wait(unit); }

 private:
  UpdateHook& inner_;
  HostState& st_;
  std::vector<int64_t> keep_;
};

Outcome train(const Case& s, GradHome home, const BeforeStep& before = {}, GradDType held = GradDType::F32,
              bool round_host_grads = false) {
  CpuBackend be(s.c, test::cpu_opts());
  Outcome r;
  HostStateOptions ho;
  ho.grads = home;
  ho.grad_dtype = held;
  if (home == GradHome::Device) ho.host_grad_units = host_grad_units(s.c, s.p);
  ho.grad_ring_depth = s.ring_depth;
  ho.head_grad_slices = s.head_slice_rows > 0;
  HostState st(be, ho);
  r.host_bf16_grads = ho.host_bf16_grads();
  test::random_weights(be.layout(), st, 11);
  optim::AdamWConfig oc;
  oc.max_grad_norm = 0.05f;  // clipping active: the global norm must be exact before any update
  oc.threads = 1;
  optim::CpuAdamW opt(unit_specs(be.layout()), oc);
  AdamWHook adamw(opt, st);
  RoundToBf16Hook rounding(adamw, st, s.round_host_embedding ? std::vector<int64_t>{} : host_grad_units(s.c, s.p));
  UpdateHook& hook_used = round_host_grads ? static_cast<UpdateHook&>(rounding) : adamw;
  struct {
    AdamWHook& a;
    void begin_step(float lr) { a.begin_step(lr); }
    void wait_all() { a.wait_all(); }
  } hook{adamw};
  r.grad_bytes = st.grad_bytes();
  auto dir = test::temp_dir("dgrad");
  {
    ExecOptions eo;
    eo.nvme_dir = dir;
    eo.micro_batches = s.nmb;
    eo.head_slice_rows = s.head_slice_rows;
    const int64_t pinned0 = be.memory().current(MemKind::Pinned);
    Executor ex(s.c, be, s.p, st, eo);
    r.pinned = be.memory().current(MemKind::Pinned) - pinned0;
    ex.set_update_hook(&hook_used);
    for (int step = 0; step < s.steps; ++step) {
      const test::StepBatches sb = test::step_batches(s.c, s.p, s.nmb, 100 + 10 * step);
      const auto& mbs = sb.mbs;
      hook.begin_step(1e-2f);
      if (before && before(be, ex, step)) {
        EXPECT_THROW(ex.train_step(mbs), Error) << "step " << step;
        r.failures++;
        hook.begin_step(1e-2f);  // the trainer's retry
      }
      const StepResult res = ex.train_step(mbs);
      r.loss.push_back(res.loss);
      r.norm.push_back(res.grad_norm);
      r.opt_norm.push_back(opt.last_step().grad_norm);
      r.peak_device = std::max(r.peak_device, res.peak_device);
      if (step == 1 && s.eval_after_step_1) r.eval.push_back(ex.eval_loss(mbs[0]));
    }
    if (s.flush) {
      ex.flush_updates();
      hook.wait_all();
    }
  }
  hook.wait_all();
  std::filesystem::remove_all(dir);
  for (int64_t u = 0; u < st.units(); ++u) {
    r.masters.emplace_back(size_t(st.numel(u)));
    st.read_master(u, r.masters.back().data());
  }
  return r;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  ASSERT_EQ(a.loss.size(), b.loss.size()) << what;
  for (size_t k = 0; k < a.loss.size(); ++k) {
    EXPECT_EQ(a.loss[k], b.loss[k]) << what << " step " << k;
    EXPECT_EQ(a.norm[k], b.norm[k]) << what << " step " << k;
    EXPECT_EQ(a.opt_norm[k], b.opt_norm[k]) << what << " step " << k;
  }
  EXPECT_EQ(a.eval, b.eval) << what;
  ASSERT_EQ(a.masters.size(), b.masters.size());
  for (size_t u = 0; u < a.masters.size(); ++u)
    EXPECT_EQ(std::memcmp(a.masters[u].data(), b.masters[u].data(), a.masters[u].size() * 4), 0)
        << what << " unit " << u;
}

ExecPlan offload_plan(int64_t L, int64_t batch, int64_t seq) {
  ExecPlan p = ExecPlan::keep_all(L, batch, seq);
  for (int64_t i = 1; i < L; ++i) p.tier[size_t(i)] = i % 2 ? CkptTier::Cpu : CkptTier::None;
  p.ring = 2;
  return p;
}

int64_t held_extra_device(const Case& s, const CpuBackend& be) {
  const int64_t chunk = s.p.chunk_samples > 0 ? s.p.chunk_samples : s.p.batch;
  const int64_t ws = be.layer_workspace_bytes(chunk * s.p.seq);
  return executor_memory(s.c, s.p, be.dtypes(), ws, {.home = GradHome::Device, .micro_batches = s.nmb}).device -
         executor_memory(s.c, s.p, be.dtypes(), ws, {.home = GradHome::Host, .micro_batches = s.nmb}).device;
}

TEST(ExecDeviceGrads, TrainingMatchesHostGradientsBitForBit) {
  int cases = 0;
  for (bool tied : {false, true})
    for (bool emb_resident : {true, false})
      for (int nmb : {1, 2})
        for (bool offload : {false, true}) {
          Case s;
          s.c = test::tiny_config(Arch::Qwen2, 5, tied);
          s.p = offload ? offload_plan(s.c.layers, 2, 8) : ExecPlan::keep_all(s.c.layers, 2, 8);
          s.p.embedding_resident = emb_resident;
          s.p.head_resident = !offload;
          s.nmb = nmb;
          const std::string what = fmt::format("tied {} emb_resident {} nmb {} {}", tied, emb_resident, nmb,
                                               describe_plan(s.p));
          const Outcome host = train(s, GradHome::Host);
          const Outcome dev = train(s, GradHome::Device);
          expect_same(host, dev, what);
          // Host memory: only the gradient the host forms (an untied, non-resident embedding) is there.
          const bool host_emb = !embedding_on_device(s.c, s.p);
          CpuBackend be(s.c, test::cpu_opts());
          EXPECT_EQ(dev.grad_bytes, host_emb ? 4 * be.layout().embedding().numel : 0) << what;
          EXPECT_GT(host.grad_bytes, dev.grad_bytes) << what;
          // Device memory: the peak grows by the held gradients (less the per-micro-batch buffers they replace).
          const int64_t extra = held_extra_device(s, be);
          EXPECT_GT(extra, 0) << what;
          EXPECT_EQ(dev.peak_device - host.peak_device, extra) << what;
          ++cases;
        }
  EXPECT_EQ(cases, 16);
}

// A shallower staging ring (StatePlacement::grad_ring_depth) pins less and trains bit for bit the same: down to one
// median unit (the largest unit then streams with the ring to itself), with offloaded checkpoints.
TEST(ExecDeviceGrads, ShallowRingTrainsTheSameAndPinsLess) {
  for (bool tied : {false, true}) {
    Case s;
    s.c = test::tiny_config(Arch::Qwen2, 6, tied);
    s.p = offload_plan(s.c.layers, 2, 8);
    const Outcome deep = train(s, GradHome::Device);
    int64_t last_pinned = deep.pinned;
    for (int depth : {4, 2, 1}) {
      s.ring_depth = depth;
      const std::string what = fmt::format("tied {} depth {}", tied, depth);
      const Outcome shallow = train(s, GradHome::Device);
      expect_same(deep, shallow, what);
      EXPECT_LT(shallow.pinned, last_pinned) << what;
      last_pinned = shallow.pinned;
      CpuBackend be(s.c, test::cpu_opts());
      const int64_t ws = be.layer_workspace_bytes(s.p.batch * s.p.seq);
      EXPECT_EQ(executor_memory(s.c, s.p, be.dtypes(), ws, {.home = GradHome::Device, .ring_depth = depth}).pinned,
                shallow.pinned - (deep.pinned - executor_memory(s.c, s.p, be.dtypes(), ws, {.home = GradHome::Device}).pinned))
          << what;
    }
  }
}

// Held in bf16: with one micro-batch the optimizer sees the fp32 gradient rounded to nearest-even, and
// the clipping norm is that of the rounded values: bit for bit what host gradients rounded before the
// update give (clipping active). Several micro-batches round at each addition: close, not equal.
TEST(ExecDeviceGrads, Bf16HeldGradientsAreTheRoundedFp32Gradients) {
  for (bool tied : {false, true})
    for (bool emb_resident : {true, false}) {
      Case s;
      s.c = test::tiny_config(Arch::Qwen3, 4, tied);
      s.p = offload_plan(s.c.layers, 2, 8);
      s.p.embedding_resident = emb_resident;
      const std::string what = fmt::format("tied {} emb_resident {}", tied, emb_resident);
      const Outcome ref = train(s, GradHome::Host, {}, GradDType::F32, true);
      const Outcome dev = train(s, GradHome::Device, {}, GradDType::Bf16);
      ASSERT_EQ(ref.loss.size(), dev.loss.size());
      for (size_t k = 0; k < ref.loss.size(); ++k) {
        EXPECT_EQ(ref.loss[k], dev.loss[k]) << what << " step " << k;
        EXPECT_EQ(ref.opt_norm[k], dev.opt_norm[k]) << what << " step " << k;
        EXPECT_NEAR(dev.norm[k], dev.opt_norm[k], 1e-6 * dev.opt_norm[k]) << what << " step " << k;
      }
      for (size_t u = 0; u < ref.masters.size(); ++u)
        EXPECT_EQ(std::memcmp(ref.masters[u].data(), dev.masters[u].data(), ref.masters[u].size() * 4), 0)
            << what << " unit " << u;
      // Not the fp32 run: the rounding is really there.
      const Outcome f32 = train(s, GradHome::Device);
      EXPECT_NE(std::memcmp(f32.masters[1].data(), dev.masters[1].data(), f32.masters[1].size() * 4), 0) << what;
      // Two micro-batches: each addition rounds; the losses stay within bf16 rounding of the fp32 run.
      s.nmb = 2;
      const Outcome f2 = train(s, GradHome::Device), b2 = train(s, GradHome::Device, {}, GradDType::Bf16);
      for (size_t k = 0; k < f2.loss.size(); ++k) EXPECT_NEAR(f2.loss[k], b2.loss[k], 1e-3 * std::abs(f2.loss[k])) << what;
    }
}

// The head's gradient by vocabulary slices and the embedding's straight into its held buffer (bf16 held gradients,
// untied head, resident table): the same sums in the same order, each held element rounded once per micro-batch, so
// training is bit for bit that of the fp32 buffers, whatever the slices (one, uneven, one row each), with several
// micro-batches and offloaded checkpoints; and the device holds no [vocab, hidden] fp32 buffer.
TEST(ExecDeviceGrads, HeadGradientBySlicesTrainsTheSameWithoutTheTableSizedBuffers) {
  for (int nmb : {1, 2}) {
    Case s;
    s.c = test::tiny_config(Arch::Qwen3, 4, false);
    s.p = offload_plan(s.c.layers, 2, 8);
    s.p.embedding_resident = true;
    s.nmb = nmb;
    s.steps = 3;
    const Outcome full = train(s, GradHome::Device, {}, GradDType::Bf16);
    CpuBackend be(s.c, test::cpu_opts());
    const int64_t ws = plan_workspace_bytes(be, s.p);
    auto predicted = [&](bool slices) {
      return executor_memory(s.c, s.p, be.dtypes(), ws,
                             {.home = GradHome::Device, .micro_batches = nmb, .dtype = GradDType::Bf16,
                              .head_slices = slices})
          .device;
    };
    int64_t one_slice_peak = 0;
    for (int64_t rows : {s.c.vocab, int64_t(7), int64_t(1)}) {
      s.head_slice_rows = rows;
      const std::string what = fmt::format("micro-batches {} slice rows {}", nmb, rows);
      const Outcome sliced = train(s, GradHome::Device, {}, GradDType::Bf16);
      expect_same(full, sliced, what);
      if (rows == s.c.vocab) {  // head_grad_slice_rows of this model: the executor's memory as predicted
        EXPECT_EQ(full.peak_device - sliced.peak_device, predicted(false) - predicted(true)) << what;
        one_slice_peak = sliced.peak_device;
      } else {
        EXPECT_EQ(one_slice_peak - sliced.peak_device, 4 * s.c.hidden * (s.c.vocab - rows)) << what;
      }
    }
    // The fp32 [vocab, hidden] buffers are what it saves: their bytes less one slice's, the norm's and the lse.
    EXPECT_GT(predicted(false) - predicted(true), 0);
  }
}

TEST(ExecDeviceGrads, RandomPlansMatchHostGradients) {
  std::mt19937_64 rng(23);
  for (int k = 0; k < 6; ++k) {
    Case s;
    s.c = test::tiny_config(k % 2 ? Arch::Qwen3 : Arch::Llama, 4, k % 3 == 0);
    s.p = test::random_plan(s.c.layers, 3, 8, rng);
    s.nmb = 1 + k % 2;
    s.steps = 3;
    expect_same(train(s, GradHome::Host), train(s, GradHome::Device), describe_plan(s.p));
  }
}

TEST(ExecDeviceGrads, PredictedBytesEqualAllocatedBytes) {
  std::mt19937_64 rng(9);
  auto dir = test::temp_dir("dgrad-mem");
  for (bool tied : {false, true})
    for (int nmb : {1, 3}) for (GradDType held : {GradDType::F32, GradDType::Bf16}) {
      auto c = test::tiny_config(Arch::Qwen3, 6, tied);
      for (int k = 0; k < 4; ++k) {
        ExecPlan p = test::random_plan(c.layers, 3, 8, rng);
        CpuBackend be(c, test::cpu_opts());
        HostStateOptions ho;
        ho.grads = GradHome::Device;
        ho.grad_dtype = held;
        ho.host_grad_units = host_grad_units(c, p);
        HostState st(be, ho);
        const int64_t dev0 = be.memory().current(MemKind::Device), pin0 = be.memory().current(MemKind::Pinned);
        ExecOptions o;
        o.nvme_dir = dir;
        o.micro_batches = nmb;
        Executor ex(c, be, p, st, o);
        const int64_t chunk = p.chunk_samples > 0 ? p.chunk_samples : p.batch;
        int64_t kept = 0;
        for (int64_t b : kept_internals_bytes(be, p)) kept += b;
        auto m = executor_memory(c, p, be.dtypes(), be.layer_workspace_bytes(chunk * p.seq),
                                 {.home = GradHome::Device, .micro_batches = nmb, .dtype = held}, kept);
        EXPECT_EQ(be.memory().current(MemKind::Device) - dev0, m.device) << describe_plan(p);
        EXPECT_EQ(be.memory().current(MemKind::Pinned) - pin0, m.pinned) << describe_plan(p);
        const std::string table = ex.memory_table();
        for (const char* tag : {"grads.held", "grads.staging"})
          EXPECT_NE(table.find(tag), std::string::npos) << tag << " missing in\n" << table;
      }
    }
  std::filesystem::remove_all(dir);
}

TEST(ExecDeviceGrads, FailedStepsWhileGradientsStreamLoseNothing) {
  for (int nmb : {1, 2}) {
    Case s;
    s.c = test::tiny_config(Arch::Qwen2, 5, true);
    s.p = offload_plan(s.c.layers, 2, 8);
    s.nmb = nmb;
    s.steps = 5;
    const Outcome host = train(s, GradHome::Host);
    // Step 1: a compute op of the forward fails while step 0's gradients stream; step 2: the first D2H
    // copy (a gradient on its way to the optimizer) fails; step 3: an op late in the backward fails,
    // after held buffers were overwritten.
    const Outcome dev = train(s, GradHome::Device, [](CpuBackend& be, Executor&, int step) {
      if (step == 1) be.inject_failure(Lane::Compute, 3, "injected forward failure");
      if (step == 2) be.inject_failure(Lane::D2H, 1, "injected copy failure");
      if (step == 3) be.inject_failure(Lane::Compute, 30, "injected backward failure");
      return step >= 1 && step <= 3;
    });
    EXPECT_EQ(dev.failures, 3);
    expect_same(host, dev, fmt::format("nmb {}", nmb));
  }
}

TEST(ExecDeviceGrads, EvalWhileGradientsStreamAndDestroyWithoutFlush) {
  Case s;
  s.c = test::tiny_config(Arch::Qwen3, 4, false);
  s.p = ExecPlan::keep_all(s.c.layers, 2, 8);
  s.p.head_resident = false;
  s.eval_after_step_1 = true;
  const Outcome host = train(s, GradHome::Host);
  const Outcome dev = train(s, GradHome::Device);
  ASSERT_EQ(dev.eval.size(), 1u);
  expect_same(host, dev, "eval in between");
  s.flush = false;  // the executor's destructor streams the last step's gradients
  expect_same(host, train(s, GradHome::Device), "destroyed without flush");
}

TEST(ExecDeviceGrads, SeveralMicroBatchesNeedAccumulators) {
  auto c = test::tiny_config(Arch::Qwen2, 3, false);
  CpuBackend be(c, test::cpu_opts());
  HostStateOptions ho;
  ho.grads = GradHome::Device;
  HostState st(be, ho);
  Executor ex(c, be, ExecPlan::keep_all(c.layers, 2, 8), st);
  auto b = test::random_batch(c, 2, 8, 1);
  MicroBatch mb{b.ids.data(), b.targets.data(), nullptr, nullptr};
  try {
    ex.train_step({mb, mb});
    ADD_FAILURE() << "two micro-batches into one-micro-batch held gradients";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ExecOptions::micro_batches"), std::string::npos) << e.what();
  }
  // An untied, non-resident embedding is differentiated on the host: it needs its host gradient.
  ExecPlan p = ExecPlan::keep_all(c.layers, 2, 8);
  p.embedding_resident = false;
  try {
    Executor ex2(c, be, p, st);
    ADD_FAILURE() << "host embedding without a host gradient";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("host_grad_units"), std::string::npos) << e.what();
  }
}

// The gradients each unit's update is handed in one step (bf16; a host fp32 one rounded to nearest-even), and the sums
// of squares reported with them.
class CaptureHook final : public UpdateHook {
 public:
  explicit CaptureHook(HostState& st) : st_(st), grads(size_t(st.units())), sumsq(size_t(st.units()), -1.0) {}
  void grad_ready(int64_t u, double ss) override {
    sumsq[size_t(u)] = ss;
    auto& g = grads[size_t(u)];
    if (const bf16_t* b = st_.grad_bf16(u)) {
      g.assign(b, b + st_.numel(u));
      return;
    }
    const float* f = st_.grad(u);
    for (int64_t i = 0; i < st_.numel(u); ++i) g.push_back(f32_to_bf16(f[i]));
  }
  void grad_norm_part(int64_t u, double ss) override { sumsq[size_t(u)] = ss; }
  void grad_staged(int64_t u, const void* grad, DType dtype) override {
    ASSERT_EQ(dtype, DType::BF16);
    const auto* b = static_cast<const bf16_t*>(grad);
    grads[size_t(u)].assign(b, b + st_.numel(u));
  }
  void wait(int64_t) override {}

 private:
  HostState& st_;

 public:
  std::vector<std::vector<bf16_t>> grads;
  std::vector<double> sumsq;
};

CaptureHook capture_bf16_step(const Case& s, GradHome home, CpuBackend& be, std::unique_ptr<HostState>& st) {
  HostStateOptions ho;
  ho.grads = home;
  ho.grad_dtype = GradDType::Bf16;
  if (home == GradHome::Device) ho.host_grad_units = host_grad_units(s.c, s.p);
  st = std::make_unique<HostState>(be, ho);
  test::random_weights(be.layout(), *st, 11);
  CaptureHook hook(*st);
  auto dir = test::temp_dir("bf16-capture");
  {
    ExecOptions eo;
    eo.nvme_dir = dir;
    Executor ex(s.c, be, s.p, *st, eo);
    ex.set_update_hook(&hook);
    ex.train_step(test::step_batches(s.c, s.p, 1, 100).mbs);
    ex.flush_updates();
  }
  std::filesystem::remove_all(dir);
  return hook;
}

// Gradients on the host in bf16 are rounded on the device by the held bf16 path's own Backend::grad_add as they
// leave: every unit's update gets the same bf16 gradient bit for bit as with gradients held on the device in bf16,
// with the same sum of squares (a host-looked-up embedding, fp32 on the host there, is rounded by add_into_bf16 on the
// host: its gradient equals the fp32 one rounded to nearest-even). Training then matches bit for bit.
TEST(ExecDeviceGrads, HostBf16GradientsAreTheHeldBf16Gradients) {
  for (bool tied : {false, true})
    for (bool emb_resident : {true, false}) {
      Case s;
      s.c = test::tiny_config(Arch::Qwen3, 4, tied);
      s.p = offload_plan(s.c.layers, 2, 8);
      s.p.embedding_resident = emb_resident;
      const std::string what = fmt::format("tied {} emb_resident {}", tied, emb_resident);
      const bool host_emb = !embedding_on_device(s.c, s.p);
      CpuBackend be_h(s.c, test::cpu_opts()), be_d(s.c, test::cpu_opts());
      std::unique_ptr<HostState> st_h, st_d;
      const CaptureHook host = capture_bf16_step(s, GradHome::Host, be_h, st_h);
      const CaptureHook dev = capture_bf16_step(s, GradHome::Device, be_d, st_d);
      for (int64_t u = 0; u < st_h->units(); ++u) {
        ASSERT_EQ(host.grads[size_t(u)].size(), size_t(st_h->numel(u))) << what << " unit " << u;
        EXPECT_EQ(host.grads[size_t(u)], dev.grads[size_t(u)]) << what << " unit " << u;
        if (!(u == 0 && host_emb)) EXPECT_EQ(host.sumsq[size_t(u)], dev.sumsq[size_t(u)]) << what << " unit " << u;
      }
      EXPECT_EQ(st_h->grad_bytes(), 2 * st_h->total_numel()) << what;
      // Four steps of training (clipping active).
      const Outcome h = train(s, GradHome::Host, {}, GradDType::Bf16);
      EXPECT_TRUE(h.host_bf16_grads);
      if (!host_emb) {
        expect_same(h, train(s, GradHome::Device, {}, GradDType::Bf16), what);
      } else {
        Case r = s;
        r.round_host_embedding = true;
        Outcome ref = train(r, GradHome::Host, {}, GradDType::F32, true);
        // The executor's norm there is the fp32 gradients' (the hook rounds them after it); the optimizer's is compared.
        ref.norm = h.norm;
        expect_same(h, ref, what);
      }
    }
}

// Host bf16 gradients: the executor allocates what executor_memory predicts (the two bf16 rounding buffers beside the
// fp32 ones), and refuses several micro-batches and updates on the device, naming why.
TEST(ExecDeviceGrads, HostBf16MemoryAndLimits) {
  auto dir = test::temp_dir("hbf16-mem");
  std::mt19937_64 rng(5);
  for (bool tied : {false, true}) {
    auto c = test::tiny_config(Arch::Qwen3, 4, tied);
    ExecPlan p = test::random_plan(c.layers, 3, 8, rng);
    CpuBackend be(c, test::cpu_opts());
    HostStateOptions ho;
    ho.grads = GradHome::Host;
    ho.grad_dtype = GradDType::Bf16;
    HostState st(be, ho);
    const int64_t dev0 = be.memory().current(MemKind::Device), pin0 = be.memory().current(MemKind::Pinned);
    ExecOptions o;
    o.nvme_dir = dir;
    {
      Executor ex(c, be, p, st, o);
      const int64_t chunk = p.chunk_samples > 0 ? p.chunk_samples : p.batch;
      int64_t kept = 0;
      for (int64_t b : kept_internals_bytes(be, p)) kept += b;
      const auto m = executor_memory(c, p, be.dtypes(), be.layer_workspace_bytes(chunk * p.seq),
                                     {.dtype = GradDType::Bf16}, kept);
      EXPECT_EQ(be.memory().current(MemKind::Device) - dev0, m.device) << describe_plan(p);
      EXPECT_EQ(be.memory().current(MemKind::Pinned) - pin0, m.pinned) << describe_plan(p);
      EXPECT_NE(ex.memory_table().find("grads.bf16_pieces"), std::string::npos) << ex.memory_table();
      auto b = test::random_batch(c, p.batch, p.seq, 1);
      MicroBatch mb{b.ids.data(), b.targets.data(), nullptr, nullptr};
      try {
        ex.train_step({mb, mb});
        ADD_FAILURE() << "two micro-batches with bf16 host gradients";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("one per step"), std::string::npos) << e.what();
      }
    }
    o.micro_batches = 2;
    try {
      Executor ex(c, be, p, st, o);
      ADD_FAILURE() << "ExecOptions::micro_batches 2 with bf16 host gradients";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("2 micro-batches"), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(ExecDeviceGrads, BackendGradAddAccumulatesAndSumsSquares) {
  auto c = test::tiny_config(Arch::Qwen2, 2, false);
  CpuBackend be(c, test::cpu_opts());
  Buffer acc(be, MemKind::Device, 3 * 4, "t"), g(be, MemKind::Device, 3 * 4, "t"), ss(be, MemKind::Device, 8, "t");
  const float a0[3] = {1.0f, -2.0f, 0.25f}, g0[3] = {0.5f, 1.0f, -0.25f};
  std::memcpy(acc.data(), a0, sizeof a0);
  std::memcpy(g.data(), g0, sizeof g0);
  *ss.as<double>() = 1.0;
  be.grad_add(acc.data(), DType::F32, g.data(), 3, nullptr, {"t", -1, -1});
  be.grad_add(acc.data(), DType::F32, g.data(), 3, ss.as<double>(), {"t", -1, -1});
  be.synchronize();
  EXPECT_EQ(acc.as<float>()[0], 2.0f);
  EXPECT_EQ(acc.as<float>()[1], 0.0f);
  EXPECT_EQ(acc.as<float>()[2], -0.25f);
  EXPECT_EQ(*ss.as<double>(), 1.0 + 4.0 + 0.0625);
  // A bf16 accumulator: the fp32 sum rounded to nearest-even (1 + 2^-9 rounds back to 1).
  Buffer b(be, MemKind::Device, 3 * 2, "t");
  const bf16_t b0[3] = {f32_to_bf16(1.0f), f32_to_bf16(-2.0f), f32_to_bf16(0.25f)};
  const float g1[3] = {0x1p-9f, 0x1.8p-8f, -0.25f};
  std::memcpy(b.data(), b0, sizeof b0);
  std::memcpy(g.data(), g1, sizeof g1);
  *ss.as<double>() = 0;
  be.grad_add(b.data(), DType::BF16, g.data(), 3, ss.as<double>(), {"t", -1, -1});
  be.synchronize();
  EXPECT_EQ(bf16_to_f32(b.as<bf16_t>()[0]), 1.0f);
  EXPECT_EQ(bf16_to_f32(b.as<bf16_t>()[1]), -2.0f + 0x1p-7f);  // -2 + 3/512: nearest bf16 step of 2^-7
  EXPECT_EQ(bf16_to_f32(b.as<bf16_t>()[2]), 0.0f);
  EXPECT_EQ(*ss.as<double>(), 1.0 + double(-2.0f + 0x1p-7f) * double(-2.0f + 0x1p-7f));
  EXPECT_THROW(be.grad_add(b.data(), DType::U8, g.data(), 3, nullptr, {"t", -1, -1}), Error);
  // The host's bf16 accumulation (add_into_bf16) is the same function, bit for bit, with the same sum of squares.
  bf16_t h[3];
  std::memcpy(h, b0, sizeof h);
  EXPECT_EQ(add_into_bf16(h, g1, 3), 1.0 + double(-2.0f + 0x1p-7f) * double(-2.0f + 0x1p-7f));
  EXPECT_EQ(std::memcmp(h, b.data(), sizeof h), 0);
}

}  // namespace
}  // namespace lt
