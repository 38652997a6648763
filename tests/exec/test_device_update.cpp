// The embedding's update on the device (HostStateOptions::embedding_update_device, exec/device_update.h): training
// through AdamWHook gives the same losses, norms, master weights and moments as the CPU optimizer's update, bit for
// bit, over micro-batch counts, offloaded checkpoints and an eval in between; after flush_updates the host copies are
// current; a failed step loses nothing; the backend op is the optimizer's fp32 arithmetic. (The split master on the
// bf16-streaming GPU: tests/gpu/test_device_update.cpp.)
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/split_master.h"
#include "exec/executor.h"
#include "exec/optim_hook.h"
#include "exec_test_util.h"
#include "optim/adamw_kernels.h"

namespace lt {
namespace {

struct Outcome {
  std::vector<double> loss, norm, eval;
  std::vector<std::vector<float>> masters;
  std::vector<float> m0, v0;  // the embedding's moments (optimizer's host arrays)
  std::vector<float> m1, v1;  // layer 0's biggest tensor's moments (dequantised when 8-bit)
  int64_t grad_bytes = 0, failures = 0;
};

struct Case {
  ModelConfig c;
  ExecPlan p;
  int nmb = 1;
  int steps = 4;
  bool eval_after_step_1 = false;
  int fail_step = -1;  // this step's first try fails in the backward (then runs again)
  int64_t device_layers = 0;  // on_device: the first layers' updates on the device too
  bool q8 = false;            // 8-bit moments for the matrices (the optimizer's scalar path, which the device matches)
};

// Layer 0's largest tensor (a matrix: 8-bit with Case::q8).
size_t largest_tensor(const optim::UnitSpec& u) {
  size_t t = 0;
  for (size_t k = 0; k < u.tensors.size(); ++k)
    if (u.tensors[k].numel > u.tensors[t].numel) t = k;
  return t;
}

Outcome train(const Case& s, bool on_device) {
  CpuBackend be(s.c, test::cpu_opts());
  HostStateOptions ho;
  ho.embedding_update_device = on_device;
  ho.device_update_layers = on_device ? s.device_layers : 0;
  HostState st(be, ho);
  test::random_weights(be.layout(), st, 11);
  optim::AdamWConfig oc;
  oc.max_grad_norm = 0.05f;  // clipping active: the device update must use the step's exact clip factor
  oc.threads = 1;
  oc.groups = {{1.0f, 0.1f}, {1.0f, 0.0f}};  // weight decay on the embedding
  oc.isa = optim::Isa::Scalar;  // the 8-bit path the device op matches bit for bit (AVX2 too; AVX-512 within an ulp)
  std::vector<optim::UnitSpec> specs;
  const auto kind = s.q8 ? optim::OptimizerKind::AdamW8bit : optim::OptimizerKind::AdamW;
  for (auto& u : be.layout().units) specs.push_back(optim::unit_spec_from_layout(u, kind));
  optim::CpuAdamW opt(specs, oc);
  AdamWHook hook(opt, st);
  Outcome r;
  r.grad_bytes = st.grad_bytes();
  auto dir = test::temp_dir("devupd");
  {
    ExecOptions eo;
    eo.nvme_dir = dir;
    eo.micro_batches = s.nmb;
    Executor ex(s.c, be, s.p, st, eo);
    ex.set_update_hook(&hook);
    for (int step = 0; step < s.steps; ++step) {
      const test::StepBatches sb = test::step_batches(s.c, s.p, s.nmb, 100 + 10 * step);
      const auto& mbs = sb.mbs;
      hook.begin_step(1e-2f * float(step + 1));  // the learning rate changes: the device step must use this step's
      if (step == s.fail_step) {
        be.inject_failure(Lane::Compute, 20, "injected backward failure");
        EXPECT_THROW(ex.train_step(mbs), Error);
        r.failures++;  // the optimizer's step stays begun: the retry reports into it
      }
      const StepResult res = ex.train_step(mbs);
      r.loss.push_back(res.loss);
      r.norm.push_back(res.grad_norm);
      if (step == 1 && s.eval_after_step_1) r.eval.push_back(ex.eval_loss(mbs[0]));
    }
    ex.flush_updates();
    hook.wait_all();
  }
  std::filesystem::remove_all(dir);
  for (int64_t u = 0; u < st.units(); ++u) {
    r.masters.emplace_back(size_t(st.numel(u)));
    st.read_master(u, r.masters.back().data());
  }
  opt.read_state(0, 0, r.m0, r.v0);
  opt.read_state(1, int(largest_tensor(specs[1])), r.m1, r.v1);
  return r;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  ASSERT_EQ(a.loss.size(), b.loss.size()) << what;
  for (size_t k = 0; k < a.loss.size(); ++k) {
    EXPECT_EQ(a.loss[k], b.loss[k]) << what << " step " << k;
    EXPECT_EQ(a.norm[k], b.norm[k]) << what << " step " << k;
  }
  EXPECT_EQ(a.eval, b.eval) << what;
  ASSERT_EQ(a.masters.size(), b.masters.size());
  for (size_t u = 0; u < a.masters.size(); ++u)
    EXPECT_EQ(std::memcmp(a.masters[u].data(), b.masters[u].data(), a.masters[u].size() * 4), 0) << what << " unit " << u;
  ASSERT_EQ(a.m0.size(), b.m0.size());
  EXPECT_EQ(std::memcmp(a.m0.data(), b.m0.data(), a.m0.size() * 4), 0) << what << " m";
  EXPECT_EQ(std::memcmp(a.v0.data(), b.v0.data(), a.v0.size() * 4), 0) << what << " v";
  ASSERT_EQ(a.m1.size(), b.m1.size());
  EXPECT_EQ(std::memcmp(a.m1.data(), b.m1.data(), a.m1.size() * 4), 0) << what << " layer 0 m";
  EXPECT_EQ(std::memcmp(a.v1.data(), b.v1.data(), a.v1.size() * 4), 0) << what << " layer 0 v";
}

ExecPlan offload_plan(int64_t L, int64_t batch, int64_t seq) {
  ExecPlan p = ExecPlan::keep_all(L, batch, seq);
  for (int64_t i = 1; i < L; ++i) p.tier[size_t(i)] = i % 2 ? CkptTier::Cpu : CkptTier::None;
  return p;
}

TEST(ExecDeviceUpdate, TrainingMatchesTheCpuOptimizerBitForBit) {
  for (int nmb : {1, 2})
    for (bool offload : {false, true}) {
      Case s;
      s.c = test::tiny_config(Arch::Qwen2, 4, true);
      s.p = offload ? offload_plan(s.c.layers, 2, 8) : ExecPlan::keep_all(s.c.layers, 2, 8);
      s.nmb = nmb;
      s.eval_after_step_1 = true;
      const std::string what = fmt::format("nmb {} {}", nmb, describe_plan(s.p));
      const Outcome host = train(s, false), dev = train(s, true);
      expect_same(host, dev, what);
      // The embedding changed (the test is not comparing two untouched tables), and it has no host gradient.
      std::vector<float> init(host.masters[0].size());
      {
        CpuBackend be(s.c, test::cpu_opts());
        HostState st(be);
        test::random_weights(be.layout(), st, 11);
        st.read_master(0, init.data());
      }
      EXPECT_NE(std::memcmp(init.data(), dev.masters[0].data(), init.size() * 4), 0) << what;
      EXPECT_EQ(host.grad_bytes - dev.grad_bytes, 4 * int64_t(init.size())) << what;
    }
}

// The first layers updated on the device too (HostStateOptions::device_update_layers), with fp32 and 8-bit moments:
// the same losses, norms, masters and moments as the CPU optimizer's update, over micro-batch counts, offloaded
// checkpoints and an eval between steps; the layers' weights are not uploaded (the ring loads nothing for them) and
// they have no host gradient.
TEST(ExecDeviceUpdate, FirstLayersOnTheDeviceMatchTheCpuOptimizer) {
  for (Arch arch : {Arch::Qwen2, Arch::Qwen3_5})  // Qwen3.5: Gated DeltaNet and gated attention layers
  for (bool q8 : {false, true})
    for (int nmb : {1, 2})
      for (int64_t k : {int64_t(1), int64_t(3)}) {
        Case s;
        s.c = test::tiny_config(arch, 4, true);
        s.p = nmb == 2 ? offload_plan(s.c.layers, 2, 8) : ExecPlan::keep_all(s.c.layers, 2, 8);
        s.nmb = nmb;
        s.q8 = q8;
        s.device_layers = k;
        s.eval_after_step_1 = true;
        const std::string what = fmt::format("{} q8 {} nmb {} layers {}", arch_hf_name(arch), q8, nmb, k);
        const Outcome host = train(s, false), dev = train(s, true);
        expect_same(host, dev, what);
        int64_t layer_elems = 0;
        for (int64_t u = 0; u <= k; ++u) layer_elems += int64_t(dev.masters[size_t(u)].size());
        EXPECT_EQ(host.grad_bytes - dev.grad_bytes, 4 * layer_elems) << what;
        EXPECT_FALSE(dev.m1.empty());
      }
}

TEST(ExecDeviceUpdate, FirstLayersSkipTheirUploads) {
  auto c = test::tiny_config(Arch::Qwen3, 4, true);
  const ExecPlan p = ExecPlan::keep_all(c.layers, 2, 8);
  // Loads of layers 1 and 2 in one step's trace ("w.h2d <layer>"; layer 0's name is the embedding's too).
  auto uploads = [&](int64_t k) {
    CpuBackend be(c, test::cpu_opts());
    HostStateOptions ho;
    ho.device_update_layers = k;
    HostState st(be, ho);
    test::random_weights(be.layout(), st, 3);
    AdamWHook hook(be.layout(), st, OptimizerSetup{});
    Executor ex(c, be, p, st);
    ex.set_update_hook(&hook);
    for (int step = 0; step < 2; ++step) {  // the second step's forward reads the updated device copies
      const test::StepBatches sb = test::step_batches(c, p, 1, 7 + step);
      hook.begin_step(1e-3f);
      ex.train_step(sb.mbs);
    }
    const auto dir = test::temp_dir("devupd-trace");
    ex.write_trace(dir / "t.json");
    hook.wait_all();
    std::ifstream f(dir / "t.json");
    const nlohmann::json j = nlohmann::json::parse(f);
    std::filesystem::remove_all(dir);
    std::pair<int, int> n{0, 0};
    for (const auto& ev : j.at("traceEvents")) {
      const std::string name = ev.value("name", "");
      n.first += name == "w.h2d 1";
      n.second += name == "w.h2d 2";
    }
    return n;
  };
  const auto all = uploads(0), some = uploads(2);
  EXPECT_GT(all.first, 0);
  EXPECT_EQ(some.first, 0) << "layer 1 is updated on the device: never uploaded";
  EXPECT_EQ(some.second, all.second) << "layer 2 is uploaded as before";
}

TEST(ExecDeviceUpdate, AFailedStepLosesNothing) {
  Case s;
  s.c = test::tiny_config(Arch::Qwen3, 3, true);
  s.p = ExecPlan::keep_all(s.c.layers, 2, 8);
  s.fail_step = 2;
  const Outcome host = train(s, false), dev = train(s, true);
  EXPECT_EQ(dev.failures, 1);
  expect_same(host, dev, "failed step 2");
}

TEST(ExecDeviceUpdate, NeedsTheTableOnTheDeviceAndHostGradients) {
  auto c = test::tiny_config(Arch::Qwen2, 3, false);
  CpuBackend be(c, test::cpu_opts());
  HostStateOptions ho;
  ho.embedding_update_device = true;
  HostState st(be, ho);
  ExecPlan p = ExecPlan::keep_all(c.layers, 2, 8);
  p.embedding_resident = false;  // untied, looked up on the host
  try {
    Executor ex(c, be, p, st);
    ADD_FAILURE() << "device update of a table looked up on the host";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("looks it up on the host"), std::string::npos) << e.what();
  }
}

// The backend op is the optimizer's fp32 path element for element: on an fp32 master, and on a split one (join,
// update, split) as the optimizer's tile path does it; random values with some clipping and decay.
TEST(ExecDeviceUpdate, BackendStepIsTheOptimizersArithmetic) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 4099;
  std::vector<float> p(n), g(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = nd(rng) * 0.05f, g[i] = nd(rng) * 1e-2f, m[i] = nd(rng) * 1e-3f, v[i] = std::abs(nd(rng)) * 1e-6f;
  }
  for (int step : {1, 7}) {
    const optim::AdamWScalars s = optim::make_adamw_scalars(3e-4, 0.1, 0.9, 0.999, 1e-8, step, 0.37f);
    const AdamWStepScalars d = device_scalars(s);
    // fp32 master
    std::vector<float> p1 = p, m1 = m, v1 = v, p2 = p, m2 = m, v2 = v;
    optim::adamw_f32(optim::Isa::Scalar, s, p1.data(), g.data(), m1.data(), v1.data(), nullptr, n);
    cpu::adamw_step(d, p2.data(), nullptr, nullptr, g.data(), m2.data(), v2.data(), n);
    EXPECT_EQ(std::memcmp(p1.data(), p2.data(), n * 4), 0) << "step " << step;
    EXPECT_EQ(std::memcmp(m1.data(), m2.data(), n * 4), 0) << "step " << step;
    EXPECT_EQ(std::memcmp(v1.data(), v2.data(), n * 4), 0) << "step " << step;
    EXPECT_NE(std::memcmp(p1.data(), p.data(), n * 4), 0);
    // split master
    std::vector<bf16_t> hi(n);
    std::vector<uint16_t> lo(n);
    for (int64_t i = 0; i < n; ++i) split_master(p[i], &hi[i], &lo[i]);
    std::vector<float> m3 = m, v3 = v;
    cpu::adamw_step(d, nullptr, hi.data(), lo.data(), g.data(), m3.data(), v3.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f32_bits(join_master(hi[i], lo[i])), f32_bits(p1[i])) << i;
    EXPECT_EQ(std::memcmp(m1.data(), m3.data(), n * 4), 0);
  }
}

}  // namespace
}  // namespace lt
