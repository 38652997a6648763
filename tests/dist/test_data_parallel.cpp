// Data-parallel steps (ranks as threads, CPU backend) against the single-process run with the same
// global batch, and checkpoints across world sizes.
//
// Tolerance: N = 1 is bit-exact, and so is one micro-batch per rank: each rank's gradient is normalised by
// the global batch's loss tokens (Executor::train_step's loss_tokens) and the ranks' gradients are summed
// in rank order, the order in which one process accumulates its micro-batches. With several micro-batches
// per rank the result differs from the single-process run only in fp32 rounding: the gradient sum over
// micro-batches is associated differently ((g0+g1)+(g2+g3) instead of ((g0+g1)+g2)+g3). AdamW divides by sqrt(v), which amplifies
// relative gradient differences in elements with tiny gradients, so weights are compared with an absolute
// tolerance of a few lr * 1e-3. With 8-bit moments a last-bit difference can move a moment to the
// neighbouring code, which changes that element's update by a few % of lr: tolerance 0.05 lr.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <tuple>
#include <fstream>
#include <iterator>
#include <mutex>

#include "../exec/exec_test_util.h"
#include "dist/data_parallel.h"
#include "dist/dist_checkpoint.h"
#include "dist/thread_comm.h"
#include "exec/optim_hook.h"
#include "optim/layout_spec.h"

namespace lt::dist {
namespace {
namespace fs = std::filesystem;

constexpr float kLr = 1e-2f;

struct DpSetup {
  ModelConfig c = test::tiny_config(Arch::Qwen2, 3, true);
  int64_t batch = 2, seq = 8;
  int n_mb = 6;  // global batch: 6 micro-batches of 2 x 8
  std::vector<test::Batch> data;
  optim::AdamWConfig oc;
  optim::OptimizerKind kind = optim::OptimizerKind::AdamW;
  DpSetup() {
    oc.threads = 1;
    oc.max_grad_norm = 0.5f;  // clipping active
    for (int s = 0; s < 4; ++s)
      for (int m = 0; m < n_mb; ++m) data.push_back(test::random_batch(c, batch, seq, uint64_t(1000 + 10 * s + m)));
  }
  std::vector<MicroBatch> step_batch(int s) const {
    std::vector<MicroBatch> v;
    for (int m = 0; m < n_mb; ++m) {
      auto& b = data[size_t(s * n_mb + m)];
      v.push_back({b.ids.data(), b.targets.data(), nullptr, nullptr});
    }
    return v;
  }
  std::vector<optim::UnitSpec> specs(const ModelLayout& lay) const {
    std::vector<optim::UnitSpec> v;
    for (auto& u : lay.units) v.push_back(optim::unit_spec_from_layout(u, kind));
    return v;
  }
  ExecPlan plan() const {
    ExecPlan p = ExecPlan::keep_all(c.layers, batch, seq);
    p.tier[1] = CkptTier::Cpu;
    p.tier[2] = CkptTier::None;
    return p;
  }
};

struct DpRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> masters;
};

DpRun single_process(const DpSetup& S, int steps) {
  CpuBackend be(S.c, test::cpu_opts());
  HostState st(be, dp_host_state());
  test::random_weights(be.layout(), st, 7);
  optim::CpuAdamW opt(S.specs(be.layout()), S.oc);
  AdamWHook hook(opt, st);
  Executor ex(S.c, be, S.plan(), st);
  ex.set_update_hook(&hook);
  DpRun r;
  for (int s = 0; s < steps; ++s) {
    opt.begin_step(kLr);
    r.losses.push_back(ex.train_step(S.step_batch(s)).loss);
  }
  opt.wait_all();
  for (int64_t u = 0; u < st.units(); ++u) r.masters.emplace_back(st.master(u), st.master(u) + st.numel(u));
  return r;
}

// Runs steps [from, to) on W ranks; loads `load` first and saves to `save` at the end if given.
DpRun data_parallel(const DpSetup& S, int W, int from, int to, const fs::path& load = {}, const fs::path& save = {}) {
  DpRun out;
  std::mutex mu;
  run_ranks(W, [&](Communicator& comm) {
    CpuBackend be(S.c, test::cpu_opts());
    HostState st(be, dp_host_state());
    test::random_weights(be.layout(), st, 7);
    const auto full = S.specs(be.layout());
    const ShardLayout shards = make_shard_layout(full, W);
    optim::CpuAdamW opt(rank_unit_specs(full, shards, comm.rank()), S.oc);
    ShardedUpdateHook hook(comm, st, shards, opt);
    DistModel dm{&S.c, &be.layout(), &st, &opt, &full, &shards};
    if (!load.empty()) load_dist_checkpoint(load, comm, dm);
    Executor ex(S.c, be, S.plan(), st);
    ex.set_update_hook(&hook);
    std::vector<double> losses;
    for (int s = from; s < to; ++s) {
      auto mine = rank_share(S.step_batch(s), comm.rank(), W);
      auto r = data_parallel_step(comm, ex, hook, opt, mine, kLr);
      losses.push_back(r.loss);
    }
    hook.sync();
    if (!save.empty()) save_dist_checkpoint(save, comm, hook, dm);
    std::lock_guard<std::mutex> g(mu);
    if (comm.rank() == 0) {
      out.losses = losses;
      for (int64_t u = 0; u < st.units(); ++u) out.masters.emplace_back(st.master(u), st.master(u) + st.numel(u));
    } else {  // every rank ends with the same full weights
      for (int64_t u = 0; u < st.units(); ++u)
        EXPECT_EQ(std::memcmp(out.masters.empty() ? st.master(u) : out.masters[size_t(u)].data(), st.master(u),
                              size_t(st.numel(u)) * 4),
                  0);
    }
  });
  return out;
}

double max_abs_diff(const DpRun& a, const DpRun& b) {
  double d = 0;
  for (size_t u = 0; u < a.masters.size(); ++u)
    for (size_t i = 0; i < a.masters[u].size(); ++i)
      d = std::max(d, double(std::fabs(a.masters[u][i] - b.masters[u][i])));
  return d;
}

class DataParallel : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(DataParallel, EqualsTheSingleProcessRunWithTheSameGlobalBatch) {
  const int W = std::get<0>(GetParam());
  const bool q8 = std::get<1>(GetParam());
  DpSetup S;
  S.kind = q8 ? optim::OptimizerKind::AdamW8bit : optim::OptimizerKind::AdamW;
  const DpRun ref = single_process(S, 3);
  const DpRun dp = data_parallel(S, W, 0, 3);
  ASSERT_EQ(dp.losses.size(), 3u);
  for (int s = 0; s < 3; ++s) {
    if (W == 1)
      EXPECT_EQ(dp.losses[size_t(s)], ref.losses[size_t(s)]) << "step " << s;
    else
      EXPECT_NEAR(dp.losses[size_t(s)], ref.losses[size_t(s)], 2e-6 * ref.losses[size_t(s)]) << "step " << s;
  }
  const double d = max_abs_diff(dp, ref);
  std::printf("W=%d %s: max |w_dp - w_single| after 3 steps = %.3g (lr %.0e)\n", W, q8 ? "adamw8bit" : "adamw", d,
              double(kLr));
  if (W == 1)
    EXPECT_EQ(d, 0.0);
  else  // 8-bit: a last-bit gradient difference can move a moment across a code boundary (see top)
    EXPECT_LT(d, (q8 ? 50 : 3) * kLr * 1e-3) << "max |w_dp - w_single|";
  // And the steps did move the weights far more than that.
  DpSetup S0;
  DpRun init = single_process(S0, 0);
  EXPECT_GT(max_abs_diff(ref, init), 3 * kLr);
}

INSTANTIATE_TEST_SUITE_P(Dist, DataParallel, ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool()));

// The global batch of `launch -n W` with gradient_accumulation_steps=1: W micro-batches, one per rank, equal
// to one process accumulating W, bit for bit (losses, weights), fp32 and 8-bit moments.
TEST(LaunchGlobalBatch, OneMicroBatchPerRankIsBitIdenticalToOneProcessAccumulatingThem) {
  for (const bool q8 : {false, true})
    for (int W : {2, 3, 6}) {
      DpSetup S;
      S.kind = q8 ? optim::OptimizerKind::AdamW8bit : optim::OptimizerKind::AdamW;
      S.n_mb = W;
      const DpRun ref = single_process(S, 3);
      const DpRun dp = data_parallel(S, W, 0, 3);
      EXPECT_EQ(dp.losses, ref.losses) << "W " << W << (q8 ? " 8-bit" : "");
      EXPECT_EQ(max_abs_diff(dp, ref), 0.0) << "W " << W << (q8 ? " 8-bit" : "");
    }
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(DataParallelCheckpoint, SameFilesWhateverTheWorldSizeAndResumeWithAnother) {
  DpSetup S;
  S.kind = optim::OptimizerKind::AdamW8bit;  // 8-bit codes and block scales cross the reshard too
  const fs::path dir = fs::temp_directory_path() / ("lt-dist-ckpt-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  // Two steps on 2 ranks, checkpoint; resume on 3 ranks and on 1 rank for two more steps.
  data_parallel(S, 2, 0, 2, {}, dir / "w2");
  const DpRun r3 = data_parallel(S, 3, 2, 4, dir / "w2", dir / "w3");
  const DpRun r1 = data_parallel(S, 1, 2, 4, dir / "w2");
  const DpRun ref = single_process(S, 4);
  for (int s = 0; s < 2; ++s) {
    EXPECT_NEAR(r3.losses[size_t(s)], ref.losses[size_t(2 + s)], 2e-6 * ref.losses[size_t(2 + s)]);
    EXPECT_NEAR(r1.losses[size_t(s)], ref.losses[size_t(2 + s)], 2e-6 * ref.losses[size_t(2 + s)]);
  }
  EXPECT_LT(max_abs_diff(r3, ref), 50 * kLr * 1e-3);
  EXPECT_LT(max_abs_diff(r1, ref), 50 * kLr * 1e-3);
  // Loading a checkpoint on 3 ranks and saving it at once reproduces the 2-rank files byte for byte.
  data_parallel(S, 3, 0, 0, dir / "w2", dir / "w2-again");
  for (const char* f : {"trainer_state/optimizer.bin", "trainer_state/master/model.safetensors", "model.safetensors",
                        "config.json"}) {
    ASSERT_TRUE(fs::exists(dir / "w2" / f)) << f;
    EXPECT_EQ(slurp(dir / "w2" / f), slurp(dir / "w2-again" / f)) << f;
  }
  // The merged optimizer file loads into the unsharded optimizer (the single-process trainer's format).
  CpuBackend be(S.c, test::cpu_opts());
  optim::CpuAdamW whole(S.specs(be.layout()), S.oc);
  whole.load(dir / "w3" / "trainer_state" / "optimizer.bin");
  EXPECT_EQ(whole.step_count(), 4);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lt::dist

namespace lt::dist {
namespace {

// A rank whose share has no loss tokens contributes a zero gradient; the loss stays normalised by the
// global token count.
TEST(DataParallel, RankWithoutLossTokens) {
  DpSetup S;
  S.n_mb = 4;
  S.data.clear();
  for (int s = 0; s < 2; ++s)
    for (int m = 0; m < S.n_mb; ++m) {
      S.data.push_back(test::random_batch(S.c, S.batch, S.seq, uint64_t(2000 + 10 * s + m)));
      if (m == 3) std::fill(S.data.back().targets.begin(), S.data.back().targets.end(), cpu::kIgnoreIndex);
    }
  const DpRun ref = single_process(S, 2);
  for (int W : {2, 4}) {
    const DpRun dp = data_parallel(S, W, 0, 2);
    for (int s = 0; s < 2; ++s) EXPECT_NEAR(dp.losses[size_t(s)], ref.losses[size_t(s)], 2e-6 * ref.losses[size_t(s)]);
    EXPECT_LT(max_abs_diff(dp, ref), 3 * kLr * 1e-3) << "W " << W;
  }
}

}  // namespace
}  // namespace lt::dist
