// Sharded optimizers compute what the unsharded one computes, and their state files merge into (and
// split from) the unsharded state file byte for byte.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include "core/error.h"
#include "dist/shard.h"
#include "dist/state_shards.h"
#include "optim/layout_spec.h"

namespace lt::dist {
namespace {
namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Two units of mixed tensors: 8-bit matrices with sizes that are not block multiples, fp32 vectors.
std::vector<optim::UnitSpec> specs() {
  std::vector<optim::UnitSpec> v(2);
  auto add = [](optim::UnitSpec& u, const char* name, int64_t n, optim::StateFormat f) {
    optim::TensorSpec t;
    t.name = name;
    t.offset = (u.numel + 63) / 64 * 64;
    t.numel = n;
    t.format = f;
    t.group = f == optim::StateFormat::Q8 ? 0 : 1;
    u.numel = t.offset + n;
    u.tensors.push_back(t);
  };
  add(v[0], "a.norm", 70, optim::StateFormat::F32);
  add(v[0], "a.w", 1900, optim::StateFormat::Q8);
  add(v[0], "a.v", 1300, optim::StateFormat::F32);
  add(v[1], "b.w", 3000, optim::StateFormat::Q8);
  add(v[1], "b.bias", 33, optim::StateFormat::F32);
  return v;
}

struct Model {
  std::vector<std::vector<float>> w, g;
};

Model random_model(const std::vector<optim::UnitSpec>& u, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  Model m;
  for (auto& s : u) {
    m.w.emplace_back(size_t(s.numel));
    m.g.emplace_back(size_t(s.numel));
    for (auto& x : m.w.back()) x = n(rng);
  }
  return m;
}

void grads(Model& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 0.3f);
  for (auto& g : m.g)
    for (auto& x : g) x = n(rng);
}

TEST(StateShards, ShardedStepsMergeIntoTheUnshardedStateFile) {
  const auto full = specs();
  const fs::path dir = fs::temp_directory_path() / ("lt-dist-state-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  optim::AdamWConfig oc;
  oc.threads = 1;
  oc.max_grad_norm = 5.0f;  // clipping active (the norm is about 5.3)
  // Unsharded reference: 3 steps.
  Model ref = random_model(full, 1);
  optim::CpuAdamW opt(full, oc);
  for (int step = 0; step < 3; ++step) {
    grads(ref, 100 + step);
    std::vector<optim::UnitBuffers> b;
    for (size_t u = 0; u < full.size(); ++u) b.push_back({ref.w[u].data(), ref.g[u].data(), nullptr});
    auto info = opt.step(1e-2f, b);
    ASSERT_LT(info.clip_coef, 1.0f);
  }
  opt.save(dir / "full.bin");
  const std::string want = slurp(dir / "full.bin");
  for (int W : {1, 2, 3, 7}) {
    const ShardLayout s = make_shard_layout(full, W);
    Model m = random_model(full, 1);
    std::vector<std::unique_ptr<optim::CpuAdamW>> ranks;
    for (int r = 0; r < W; ++r) ranks.push_back(std::make_unique<optim::CpuAdamW>(rank_unit_specs(full, s, r), oc));
    for (int step = 0; step < 3; ++step) {
      grads(m, 100 + step);
      double total = 0;  // the all-reduced sum of squares, as the hook computes it
      for (size_t u = 0; u < full.size(); ++u) total += optim::grad_sumsq(m.g[u].data(), full[u].numel);
      for (int r = 0; r < W; ++r) {
        auto& o = *ranks[size_t(r)];
        o.begin_step(1e-2f);
        for (size_t u = 0; u < full.size(); ++u) {
          const int64_t lo = s.lo(int64_t(u), r);
          o.submit(int(u), {m.w[u].data() + lo, m.g[u].data() + lo, nullptr});
          o.add_grad_sumsq(int(u), u == 0 ? total : 0.0);
        }
        o.wait_all();
      }
    }
    for (size_t u = 0; u < full.size(); ++u)
      ASSERT_EQ(std::memcmp(m.w[u].data(), ref.w[u].data(), m.w[u].size() * 4), 0) << "W " << W << " unit " << u;
    std::vector<fs::path> files;
    for (int r = 0; r < W; ++r) {
      files.push_back(dir / ("rank" + std::to_string(r) + ".bin"));
      ranks[size_t(r)]->save(files.back());
    }
    merge_state_shards(files, full, s, dir / "merged.bin");
    EXPECT_EQ(slurp(dir / "merged.bin"), want) << "W " << W;
    // Split the unsharded file again: each rank's file equals what that rank saved, and loads.
    for (int r = 0; r < W; ++r) {
      split_state_file(dir / "full.bin", full, s, r, dir / "split.bin");
      EXPECT_EQ(slurp(dir / "split.bin"), slurp(files[size_t(r)])) << "W " << W << " rank " << r;
      optim::CpuAdamW fresh(rank_unit_specs(full, s, r), oc);
      fresh.load(dir / "split.bin");
      EXPECT_EQ(fresh.step_count(), 3);
    }
  }
  fs::remove_all(dir);
}

TEST(StateShards, RejectsAFileOfAnotherLayoutOrCorrupted) {
  const auto full = specs();
  const fs::path dir = fs::temp_directory_path() / ("lt-dist-state-bad-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  optim::AdamWConfig oc;
  oc.threads = 1;
  optim::CpuAdamW opt(full, oc);
  opt.save(dir / "full.bin");
  const ShardLayout s2 = make_shard_layout(full, 2);
  // A rank file where the merge expects the whole model: wrong layout.
  split_state_file(dir / "full.bin", full, s2, 0, dir / "r0.bin");
  try {
    split_state_file(dir / "r0.bin", full, s2, 0, dir / "x.bin");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("r0.bin"), std::string::npos) << e.what();
  }
  // Flip a payload byte.
  std::string b = slurp(dir / "full.bin");
  b[b.size() - 20] ^= 1;
  std::ofstream(dir / "bad.bin", std::ios::binary) << b;
  try {
    split_state_file(dir / "bad.bin", full, s2, 1, dir / "x.bin");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lt::dist
