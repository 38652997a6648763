// ShardedUpdateHook on its own (no executor), with synthetic per-rank gradients (each rank's part of the
// global gradient), against the unsharded optimizer fed their sum in rank order: bit-exact, for the CPU backend's fp32 streaming (master
// all-gathered every step) and for bf16 streaming (bf16 copy gathered every step, masters on demand).
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <random>

#include "../exec/exec_test_util.h"
#include "dist/data_parallel.h"
#include "dist/thread_comm.h"
#include "optim/layout_spec.h"

namespace lt::dist {
namespace {

// A CPU backend whose streamed weights are bf16: only memory and dtypes are used here.
class Bf16Backend final : public Backend {
 public:
  explicit Bf16Backend(const ModelConfig& c) : Backend(c), in_(c, test::cpu_opts()) {}
  std::string name() const override { return "bf16-test"; }
  BackendDTypes dtypes() const override { return {DType::F32, DType::BF16, DType::F32}; }
  Allocation alloc(MemKind k, int64_t bytes, const std::string& tag) override { return in_.alloc(k, bytes, tag); }
  void free(Allocation& a) override { in_.free(a); }
  int64_t layer_workspace_bytes(int64_t t, int64_t seq = 0) const override { return in_.layer_workspace_bytes(t, seq); }
  void reserve_workspace(int64_t t, int64_t seq = 0) override { in_.reserve_workspace(t, seq); }
  Event record(Lane l) override { return in_.record(l); }
  void wait(Lane l, const Event& e) override { in_.wait(l, e); }
  void host_wait(const Event& e) override { in_.host_wait(e); }
  bool done(const Event& e) override { return in_.done(e); }
  void synchronize() override { in_.synchronize(); }
  void check() override { in_.check(); }
  void clear_error() override { in_.clear_error(); }
  void copy(Lane l, void* d, const void* s, int64_t b, OpLabel o) override { in_.copy(l, d, s, b, o); }
  void fill_zero(Lane l, void* d, int64_t b, OpLabel o) override { in_.fill_zero(l, d, b, o); }
  void set_timing(bool on) override { in_.set_timing(on); }
  std::vector<Span> take_spans() override { return in_.take_spans(); }
  void embed_forward(const void*, const int32_t*, int64_t, void*, OpLabel) override { fail("not used"); }
  void embed_backward(const int32_t*, int64_t, const void*, void*, OpLabel) override { fail("not used"); }
  void layer_forward(int64_t, const void*, const DevGeometry&, const void*, void*, OpLabel) override { fail("not used"); }
  void layer_backward(int64_t, const void*, const DevGeometry&, const void*, const void*, void*, void*, OpLabel) override {
    fail("not used");
  }
  void head_loss(const void*, const void*, const int32_t*, const DevGeometry&, const void*, float, void*, void*, void*,
                 double*, OpLabel) override {
    fail("not used");
  }
  void head_logits(const void*, const void*, const void*, const int64_t*, int64_t, float*, OpLabel) override {
    fail("not used");
  }
  void grad_sumsq(const void*, int64_t, double*, OpLabel) override { fail("not used"); }
  void grad_add(void*, DType, const void*, int64_t, double*, OpLabel) override { fail("not used"); }

 private:
  CpuBackend in_;
};

void rank_grad(std::vector<float>& g, int step, int rank, int64_t unit) {
  std::mt19937_64 rng(uint64_t(step * 1000 + rank * 100 + unit));
  std::normal_distribution<float> n(0.f, 0.05f);
  for (auto& x : g) x = n(rng);
}

template <typename B>
void check_hook(int W, int steps) {
  const ModelConfig c = test::tiny_config(Arch::Qwen3, 2, false);
  optim::AdamWConfig oc;
  oc.threads = 1;
  oc.max_grad_norm = 0.3f;
  // Reference: unsharded optimizer on the summed gradient, reduced exactly as the ranks do.
  B rbe(c);
  HostState ref(rbe, dp_host_state());
  test::random_weights(rbe.layout(), ref, 3);
  std::vector<optim::UnitSpec> full;
  for (auto& u : rbe.layout().units) full.push_back(optim::unit_spec_from_layout(u, optim::OptimizerKind::AdamW8bit));
  const ShardLayout shards = make_shard_layout(full, W);
  optim::CpuAdamW ropt(full, oc);
  for (int s = 0; s < steps; ++s) {
    ropt.begin_step(1e-2f);
    for (int64_t u = 0; u < ref.units(); ++u) {
      const size_t n = size_t(ref.numel(u));
      std::vector<float> sum(n), g(n);
      for (int r = 0; r < W; ++r) {
        rank_grad(g, s, r, u);
        for (size_t i = 0; i < n; ++i) sum[i] = r == 0 ? g[i] : sum[i] + g[i];
      }
      std::memcpy(ref.grad(u), sum.data(), n * 4);
      double tot = 0;
      for (int r = 0; r < W; ++r) tot += optim::grad_sumsq(sum.data() + shards.lo(u, r), shards.hi(u, r) - shards.lo(u, r));
      ropt.submit(int(u), {ref.master(u), ref.grad(u), ref.aliased() ? nullptr : static_cast<bf16_t*>(ref.stream(u))});
      ropt.add_grad_sumsq(int(u), tot);
    }
    ropt.wait_all();
  }
  run_ranks(W, [&](Communicator& comm) {
    B be(c);
    HostState st(be, dp_host_state());
    test::random_weights(be.layout(), st, 3);
    optim::CpuAdamW opt(rank_unit_specs(full, shards, comm.rank()), oc);
    ShardedUpdateHook hook(comm, st, shards, opt);
    for (int s = 0; s < steps; ++s) {
      opt.begin_step(1e-2f);
      for (int64_t u = 0; u < st.units(); ++u) {
        std::vector<float> g(size_t(st.numel(u)));
        rank_grad(g, s, comm.rank(), u);
        std::memcpy(st.grad(u), g.data(), g.size() * 4);
        hook.grad_ready(u, 0.0);
      }
      for (int64_t u = 0; u < st.units(); ++u) hook.wait(u);  // the next forward
    }
    const size_t ws = st.aliased() ? 4 : 2;
    bool stale = false;
    for (int64_t u = 0; u < st.units(); ++u) {
      EXPECT_EQ(std::memcmp(st.stream(u), ref.stream(u), size_t(st.numel(u)) * ws), 0) << "stream, unit " << u;
      const int64_t lo = shards.lo(u, comm.rank()), hi = shards.hi(u, comm.rank());
      EXPECT_EQ(std::memcmp(st.master(u) + lo, ref.master(u) + lo, size_t(hi - lo) * 4), 0) << "own master, unit " << u;
      stale = stale || std::memcmp(st.master(u), ref.master(u), size_t(st.numel(u)) * 4) != 0;
    }
    EXPECT_EQ(stale, !st.aliased() && W > 1);  // bf16 streaming: others' master ranges not gathered yet
    hook.gather_masters();
    for (int64_t u = 0; u < st.units(); ++u)
      EXPECT_EQ(std::memcmp(st.master(u), ref.master(u), size_t(st.numel(u)) * 4), 0) << "master, unit " << u;
  });
}

TEST(ShardedUpdateHook, Fp32StreamingMatchesTheUnshardedOptimizerBitForBit) {
  for (int W : {1, 2, 3}) check_hook<CpuBackend>(W, 2);
}

TEST(ShardedUpdateHook, Bf16StreamingGathersCopiesEveryStepAndMastersOnDemand) {
  for (int W : {1, 2, 3}) check_hook<Bf16Backend>(W, 2);
}

}  // namespace
}  // namespace lt::dist
