// Collectives (ThreadCommunicator: ranks as threads; ShmCommunicator: ranks as processes) and shard cuts.
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <tuple>

#include "core/dtype.h"
#include "core/error.h"
#include "dist/shard.h"
#include "dist/thread_comm.h"
#include "model/param_layout.h"
#include "optim/layout_spec.h"
#include "process_ranks.h"

namespace lt::dist {
namespace {

// The same collective tests for both transports: (processes?, world size).
class Worlds : public ::testing::TestWithParam<std::tuple<bool, int>> {
 protected:
  int world() const { return std::get<1>(GetParam()); }
  void run(const std::function<void(Communicator&)>& fn) const {
    if (!std::get<0>(GetParam())) return run_ranks(world(), fn);
    const auto r = testing::run_rank_processes(world(), fn);
    for (int q = 0; q < world(); ++q) EXPECT_EQ(r.codes[size_t(q)], 0) << "rank " << q << " (process) failed";
  }
};

TEST_P(Worlds, AllReduceSumsInRankOrder) {
  const int W = world();
  run([&](Communicator& c) {
    std::vector<float> x(37);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(c.rank() + 1) * 0.1f + float(i);
    c.all_reduce(x.data(), int64_t(x.size()), CommType::F32);
    for (size_t i = 0; i < x.size(); ++i) {
      float e = 0.1f + float(i);
      for (int q = 1; q < W; ++q) e += float(q + 1) * 0.1f + float(i);
      ASSERT_EQ(x[i], e) << "rank " << c.rank() << " i " << i;  // same order, bit-exact
    }
    EXPECT_EQ(c.sum(int64_t(c.rank())), int64_t(W * (W - 1) / 2));
    EXPECT_DOUBLE_EQ(c.sum(0.5), 0.5 * W);
  });
}

TEST_P(Worlds, ReduceScatterThenAllGatherUnevenRanges) {
  const int W = world();
  const int64_t n = 1000;
  std::vector<int64_t> b(size_t(W) + 1, 0);
  for (int r = 1; r <= W; ++r) b[size_t(r)] = r == W ? n : (n * r * r) / (W * W);  // uneven, rank 0 smallest
  run([&](Communicator& c) {
    std::vector<double> g(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) g[size_t(i)] = double(i) * (c.rank() + 1);
    c.reduce_scatter(g.data(), b, CommType::F64);
    const double f = W * (W + 1) / 2.0;
    for (int64_t i = b[size_t(c.rank())]; i < b[size_t(c.rank()) + 1]; ++i) ASSERT_EQ(g[size_t(i)], double(i) * f);
    for (int64_t i = b[size_t(c.rank())]; i < b[size_t(c.rank()) + 1]; ++i) g[size_t(i)] += 1;  // "update"
    c.all_gather(g.data(), b, CommType::F64);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(g[size_t(i)], double(i) * f + 1) << "rank " << c.rank();
  });
}

TEST_P(Worlds, Bf16AllGatherAndBroadcast) {
  const int W = world();
  run([&](Communicator& c) {
    std::vector<bf16_t> x(10);
    auto b = even_bounds(10, W);
    for (int64_t i = b[size_t(c.rank())]; i < b[size_t(c.rank()) + 1]; ++i) x[size_t(i)] = f32_to_bf16(float(i));
    c.all_gather(x.data(), b, CommType::BF16);
    for (int i = 0; i < 10; ++i) ASSERT_EQ(bf16_to_f32(x[size_t(i)]), float(i));
    int64_t v[2] = {c.rank() == W - 1 ? 42 : 0, c.rank()};
    c.broadcast(v, 2, CommType::I64, W - 1);
    EXPECT_EQ(v[0], 42);
    EXPECT_EQ(v[1], W - 1);
    EXPECT_THROW(c.reduce_scatter(x.data(), b, CommType::BF16), Error);  // every rank throws: no hang
  });
}

INSTANTIATE_TEST_SUITE_P(Dist, Worlds, ::testing::Combine(::testing::Bool(), ::testing::Values(1, 2, 3, 4)),
                         [](const auto& i) {
                           return std::string(std::get<0>(i.param) ? "processes" : "threads") +
                                  std::to_string(std::get<1>(i.param));
                         });

TEST(ThreadComm, FailingRankReleasesTheOthers) {
  try {
    run_ranks(3, [](Communicator& c) {
      if (c.rank() == 1) fail("rank 1 broke");
      c.barrier();
      c.barrier();
    });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 broke"), std::string::npos) << e.what();
  }
}

TEST(SoloComm, CollectivesAreTheIdentity) {
  auto c = solo_communicator();
  float x[3] = {1, 2, 3};
  c->all_reduce(x, 3, CommType::F32);
  c->reduce_scatter(x, {0, 3}, CommType::F32);
  c->all_gather(x, {0, 3}, CommType::F32);
  c->broadcast(x, 3, CommType::F32, 0);
  c->barrier();
  EXPECT_EQ(x[0] + x[1] + x[2], 6.0f);
  EXPECT_EQ(c->sum(int64_t(5)), 5);
  EXPECT_THROW(c->all_gather(x, {0, 1, 3}, CommType::F32), Error);
  EXPECT_THROW(c->broadcast(x, 3, CommType::F32, 1), Error);
}

TEST(ThreadComm, RejectsBadBounds) {
  run_ranks(2, [](Communicator& c) {
    float x[4] = {};
    EXPECT_THROW(c.all_gather(x, {0, 4}, CommType::F32), Error);        // 2 offsets for 2 ranks
    EXPECT_THROW(c.all_gather(x, {0, 3, 2}, CommType::F32), Error);     // decreasing
  });
}

TEST(Shards, CutsCoverTheUnitAndKeep8BitBlocksWhole) {
  ModelConfig c;
  c.name = "t";
  c.arch = Arch::Qwen2;
  c.hidden = 96;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 24;
  c.ffn = 200;
  c.vocab = 301;
  c.attn_bias = true;
  auto lay = model_layout(c);
  for (auto kind : {optim::OptimizerKind::AdamW, optim::OptimizerKind::AdamW8bit}) {
    std::vector<optim::UnitSpec> units;
    for (auto& u : lay.units) units.push_back(optim::unit_spec_from_layout(u, kind));
    for (int W : {1, 2, 3, 5, 8, 64}) {
      auto s = make_shard_layout(units, W);
      int64_t total = 0;
      for (int r = 0; r < W; ++r) total += s.owned(r);
      int64_t all = 0;
      for (auto& u : units) all += u.numel;
      EXPECT_EQ(total, all);
      for (size_t u = 0; u < units.size(); ++u) {
        const auto& b = s.bounds[u];
        ASSERT_EQ(b.front(), 0);
        ASSERT_EQ(b.back(), units[u].numel);
        for (int r = 0; r < W; ++r) {
          ASSERT_LE(b[size_t(r)], b[size_t(r) + 1]);
          // Near-even: no shard more than one block plus the even share.
          EXPECT_LE(b[size_t(r) + 1] - b[size_t(r)], units[u].numel / W + 2 * optim::kQ8Block + 1);
          for (auto& t : units[u].tensors) {
            if (b[size_t(r)] > t.offset && b[size_t(r)] < t.offset + t.numel) {
              ASSERT_EQ((b[size_t(r)] - t.offset) % optim::kQ8Block, 0) << t.name << " W " << W;
            }
          }
        }
        // The rank specs partition every tensor.
        for (auto& t : units[u].tensors) {
          int64_t covered = 0;
          for (int r = 0; r < W; ++r)
            for (auto& p : sub_unit_spec(units[u], s.lo(int64_t(u), r), s.hi(int64_t(u), r)).tensors)
              if (p.name == t.name) covered += p.numel;
          EXPECT_EQ(covered, t.numel) << t.name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace lt::dist

#include "dist/rank_cost.h"

namespace lt::dist {
namespace {

TEST(RankCost, HostResourcesAreSplitAndTheOptimizerRateScaled) {
  ResourceProfile h;
  h.name = "h200x8";
  h.dram_bytes = 512LL << 30;
  h.nvme_bytes = 1LL << 40;
  h.nvme_read_bw = 8e9;
  h.nvme_write_bw = 4e9;
  h.host_mem_bw = 160e9;
  h.h2d_bw = h.d2h_bw = 55e9;
  h.both_bw = 97e9;
  h.opt_fp32_params_per_s = 2e9;
  h.opt_8bit_params_per_s = 2.4e9;
  Topology t{8, 8, 1, 450e9};
  auto p = rank_profile(h, t);
  EXPECT_EQ(p.dram_bytes, 64LL << 30);
  EXPECT_DOUBLE_EQ(p.host_mem_bw, 20e9);
  EXPECT_DOUBLE_EQ(p.nvme_read_bw, 1e9);
  EXPECT_DOUBLE_EQ(p.opt_fp32_params_per_s, 2e9);  // 1/8 of the CPU for 1/8 of the parameters
  EXPECT_DOUBLE_EQ(p.h2d_bw, 55e9);                // own link
  t.gpus_per_pcie_link = 2;
  EXPECT_DOUBLE_EQ(rank_profile(h, t).both_bw, 48.5e9);
  // Two hosts of 8: each rank's CPU share updates 1/16 of the parameters.
  EXPECT_DOUBLE_EQ(rank_profile(h, Topology{16, 8, 1, 450e9}).opt_fp32_params_per_s, 4e9);
  EXPECT_THROW(rank_profile(h, Topology{2, 4, 1, 0}), Error);

  const int64_t P = 7'615'616'512;  // Qwen2.5-7B
  auto hs = step_collectives(P, Topology{8, 8, 1, 450e9}, h, CollectivePath::HostStaged);
  EXPECT_DOUBLE_EQ(hs.h2d, 4.0 * P + 2.0 * P / 8);
  EXPECT_DOUBLE_EQ(hs.d2h, 4.0 * P / 8 + 2.0 * P);
  EXPECT_DOUBLE_EQ(hs.link, 6.0 * P * 7 / 8);
  auto ds = step_collectives(P, Topology{8, 8, 1, 450e9}, h, CollectivePath::DeviceSide, 2);
  EXPECT_EQ(ds.h2d, 0);
  EXPECT_DOUBLE_EQ(ds.link, 4.0 * P * 7 / 8);
  EXPECT_NEAR(ds.link_s, 4.0 * P * 7 / 8 / 450e9, 1e-9);
  EXPECT_EQ(step_collectives(P, Topology{1, 1, 1, 0}, h, CollectivePath::HostStaged).link, 0);
}

}  // namespace
}  // namespace lt::dist

#include "dist/staging.h"

namespace lt::dist {
namespace {

// The host-staged NCCL collectives move each rank range through W scratch slots of `piece` elements.
// Simulate them on the CPU: staged reduce-scatter + all-gather must equal the direct ones.
TEST(Staging, RoundsCoverEveryRangeOnceAndFitTheScratch) {
  for (int W : {1, 2, 3, 5})
    for (int64_t piece : {1, 7, 64, 1000}) {
      std::vector<int64_t> b(size_t(W) + 1, 0);
      for (int r = 1; r <= W; ++r) b[size_t(r)] = b[size_t(r) - 1] + (r == 2 ? 0 : 37 * r + 5);  // rank 1 empty
      const int64_t n = b.back();
      std::vector<int> seen(size_t(n), 0);
      for (const auto& round : staging_rounds(b, piece)) {
        ASSERT_LE(int(round.size()), W);
        std::vector<char> slot(size_t(W), 0);
        for (const auto& p : round) {
          ASSERT_GT(p.count, 0);
          ASSERT_LE(p.count, piece);
          ASSERT_EQ(p.scratch, p.root * piece);
          ASSERT_FALSE(slot[size_t(p.root)]) << "two pieces of one root in a round";
          slot[size_t(p.root)] = 1;
          ASSERT_GE(p.elem, b[size_t(p.root)]);
          ASSERT_LE(p.elem + p.count, b[size_t(p.root) + 1]);
          for (int64_t i = p.elem; i < p.elem + p.count; ++i) ++seen[size_t(i)];
        }
      }
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[size_t(i)], 1) << "W " << W << " piece " << piece << " i " << i;
      // Simulated staged reduce-scatter (sum per piece into the root's buffer) equals the direct sum.
      std::vector<std::vector<double>> bufs(static_cast<size_t>(W), std::vector<double>(static_cast<size_t>(n)));
      for (int r = 0; r < W; ++r)
        for (int64_t i = 0; i < n; ++i) bufs[size_t(r)][size_t(i)] = double(i * (r + 1));
      for (const auto& round : staging_rounds(b, piece)) {
        std::vector<double> scratch(size_t(W * piece), 0.0);
        for (const auto& p : round)
          for (int r = 0; r < W; ++r)
            for (int64_t k = 0; k < p.count; ++k) scratch[size_t(p.scratch + k)] += bufs[size_t(r)][size_t(p.elem + k)];
        for (const auto& p : round)
          for (int64_t k = 0; k < p.count; ++k) bufs[size_t(p.root)][size_t(p.elem + k)] = scratch[size_t(p.scratch + k)];
      }
      for (int r = 0; r < W; ++r)
        for (int64_t i = b[size_t(r)]; i < b[size_t(r) + 1]; ++i)
          ASSERT_EQ(bufs[size_t(r)][size_t(i)], double(i) * W * (W + 1) / 2);
    }
  EXPECT_THROW(staging_rounds({0, 4}, 0), Error);
}

}  // namespace
}  // namespace lt::dist
