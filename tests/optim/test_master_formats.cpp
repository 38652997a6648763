// The storage forms of the master weights (core/split_master.h, optim MasterFormat): the split form
// rebuilds every fp32 bit pattern, the optimizer over split masters equals the fp32 path bit for bit,
// bf16 gradients equal their fp32 widening, and stochastic rounding is unbiased and reproducible.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/split_master.h"
#include "optim/master_tiles.h"
#include "optim/optimizer.h"
#include "helpers.h"

namespace lt::optim {
namespace {

using test::make_unit;
using test::randn;

uint32_t roundtrip_bits(uint32_t u) {
  bf16_t hi;
  uint16_t lo;
  split_master(bits_f32(u), &hi, &lo);
  return f32_bits(join_master(hi, lo));
}

TEST(SplitMaster, EveryFiniteFp32RebuildsBitExactly) {
  // All 2^32 patterns take ~10 s; every 7th pattern plus every pattern around each binade edge and
  // each bf16 rounding boundary keeps it under a second while touching every exponent.
  int64_t bad = 0;
  for (uint64_t u = 0; u < (1ull << 32); u += 7) {
    const uint32_t v = uint32_t(u);
    if ((v & 0x7fffffffu) > 0x7f800000u) continue;  // NaN
    bad += roundtrip_bits(v) != v;
  }
  for (uint32_t e = 0; e < 256; ++e)
    for (uint32_t s = 0; s < 2; ++s)
      for (int d = -70000; d <= 70000; d += 1) {
        const int64_t v = int64_t((s << 31) | (e << 23)) + d;
        if (v < 0 || v > 0xffffffffll || (uint32_t(v) & 0x7fffffffu) > 0x7f800000u) continue;
        bad += roundtrip_bits(uint32_t(v)) != uint32_t(v);
      }
  EXPECT_EQ(bad, 0);
}

TEST(SplitMaster, EdgeCasesAndTheCopyIsRoundToNearest) {
  const float cases[] = {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                         std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                         -std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(), 1.0f, std::nextafter(2.0f, 0.0f), 3.14159f};
  for (float x : cases) {
    bf16_t hi;
    uint16_t lo;
    split_master(x, &hi, &lo);
    EXPECT_EQ(f32_bits(join_master(hi, lo)), f32_bits(x)) << x;
    // The copy is within half a bf16 ulp and equals round-to-nearest-even except at exact ties.
    const uint32_t mag = f32_bits(x) & 0xffffu;
    if (mag != 0x8000u && std::isfinite(x) && std::fabs(x) < 3e38f) {
      EXPECT_EQ(hi, f32_to_bf16(x)) << x;
    }
  }
  // 1 + 2^-8 is half-way between bf16 1 and 1 + 2^-7: ties away from zero.
  bf16_t hi;
  uint16_t lo;
  split_master(1.0f + std::ldexp(1.0f, -8), &hi, &lo);
  EXPECT_EQ(bf16_to_f32(hi), 1.0f + std::ldexp(1.0f, -7));
  split_master(-(1.0f + std::ldexp(1.0f, -8)), &hi, &lo);
  EXPECT_EQ(bf16_to_f32(hi), -(1.0f + std::ldexp(1.0f, -7)));
  // Just below a binade edge rounds up across it and still rebuilds.
  const float below = std::nextafter(4.0f, 0.0f);
  split_master(below, &hi, &lo);
  EXPECT_EQ(bf16_to_f32(hi), 4.0f);
  EXPECT_EQ(join_master(hi, lo), below);
  // NaN stays NaN.
  split_master(std::numeric_limits<float>::quiet_NaN(), &hi, &lo);
  EXPECT_TRUE(std::isnan(bf16_to_f32(hi)));
  EXPECT_TRUE(std::isnan(join_master(hi, lo)));
}

TEST(SplitMaster, StochasticRoundingIsUnbiasedAndReproducible) {
  const float x = 1.0f + 0.3f * std::ldexp(1.0f, -7);  // 30 % of the way to the next bf16
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const bf16_t r = round_bf16_sr(x, sr_bits(sr_key(42, 3, 0), uint32_t(i)));
    const float v = bf16_to_f32(r);
    ASSERT_TRUE(v == 1.0f || v == 1.0f + std::ldexp(1.0f, -7));
    sum += v;
  }
  EXPECT_NEAR(sum / n, double(x), 2e-5);
  EXPECT_EQ(round_bf16_sr(x, sr_bits(sr_key(42, 3, 0), 17)), round_bf16_sr(x, sr_bits(sr_key(42, 3, 0), 17)));
  EXPECT_EQ(round_bf16_sr(-0.0f, 0xffff), 0x8000);  // exact values never move
  EXPECT_EQ(round_bf16_sr(2.0f, 0xffff), f32_to_bf16(2.0f));
}

TEST(MasterTiles, EveryVectorPathEqualsTheScalarFunctions) {
  std::mt19937_64 rng(3);
  const int64_t n = 100003;  // not a multiple of 16: the tails too
  std::vector<float> x(static_cast<size_t>(n));
  const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu,
                              0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffffffffu, 0x3f808000u, 0x3f818000u};
  for (int64_t i = 0; i < n; ++i)
    x[size_t(i)] = bits_f32(i < 12 ? special[i] : uint32_t(rng()));
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (!isa_supported(isa)) continue;
    limit_tile_isa(isa);
    const auto N = static_cast<size_t>(n);
    std::vector<bf16_t> hi(N), sr(N);
    std::vector<uint16_t> lo(N);
    std::vector<float> back(N), wide(N);
    split_tile(x.data(), hi.data(), lo.data(), n);
    join_tile(hi.data(), lo.data(), back.data(), n);
    widen_tile(hi.data(), wide.data(), n);
    round_tile_sr(x.data(), sr.data(), n, 0xabcdef01u, 5);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      bf16_t h;
      uint16_t l;
      split_master(x[size_t(i)], &h, &l);
      bad += hi[size_t(i)] != h || lo[size_t(i)] != l;
      bad += f32_bits(back[size_t(i)]) != f32_bits(join_master(h, l));
      bad += f32_bits(wide[size_t(i)]) != f32_bits(bf16_to_f32(h));
      bad += sr[size_t(i)] != round_bf16_sr(x[size_t(i)], sr_bits(0xabcdef01u, 5 + uint32_t(i)));
    }
    EXPECT_EQ(bad, 0) << isa_name(isa);
  }
  limit_tile_isa(Isa::Auto);
}

// Two units of mixed fp32 / 8-bit tensors and groups; sizes that cut tiles and blocks unevenly.
std::vector<UnitSpec> units() {
  return {make_unit({5000, 300, 1}, {StateFormat::F32, StateFormat::Q8, StateFormat::F32}, {0, 0, 1}),
          make_unit({4097, 2048}, {StateFormat::Q8, StateFormat::F32}, {0, 1})};
}

AdamWConfig config(MasterFormat f, Isa isa) {
  AdamWConfig c;
  c.master = f;
  c.isa = isa;
  c.threads = 3;
  c.chunk_elems = 1024;  // several work items per tensor
  c.max_grad_norm = 0.5f;
  c.sr_seed = 1234;
  return c;
}

class MasterFormats : public ::testing::TestWithParam<Isa> {};

TEST_P(MasterFormats, SplitMastersAndBf16GradientsEqualTheFp32Path) {
  const Isa isa = GetParam();
  if (!isa_supported(isa)) GTEST_SKIP() << "CPU lacks " << isa_name(isa);
  CpuAdamW ref(units(), config(MasterFormat::F32, isa)), split(units(), config(MasterFormat::Split, isa));
  const auto us = units();
  std::vector<std::vector<float>> p(us.size()), g(us.size());
  std::vector<std::vector<bf16_t>> hi(us.size()), copy(us.size()), gb(us.size());
  std::vector<std::vector<uint16_t>> lo(us.size());
  for (size_t u = 0; u < us.size(); ++u) {
    p[u] = randn(us[u].numel, 10 + u, 0.05f);
    hi[u].resize(p[u].size());
    lo[u].resize(p[u].size());
    copy[u].resize(p[u].size());
    split_tile(p[u].data(), hi[u].data(), lo[u].data(), int64_t(p[u].size()));
    for (size_t i = 0; i < p[u].size(); ++i) copy[u][i] = f32_to_bf16(p[u][i]);  // padding is never updated
  }
  for (int step = 0; step < 6; ++step) {
    std::vector<UnitBuffers> rb(us.size()), sb(us.size());
    for (size_t u = 0; u < us.size(); ++u) {
      // bf16-representable gradients, so the bf16 and fp32 forms carry the same values.
      g[u] = randn(us[u].numel, 100 * step + u, 0.3f);
      gb[u].resize(g[u].size());
      for (size_t i = 0; i < g[u].size(); ++i) {
        gb[u][i] = f32_to_bf16(g[u][i]);
        g[u][i] = bf16_to_f32(gb[u][i]);
      }
      rb[u] = UnitBuffers{p[u].data(), g[u].data(), copy[u].data(), nullptr, nullptr};
      sb[u] = UnitBuffers{nullptr, nullptr, hi[u].data(), lo[u].data(), gb[u].data()};
    }
    const StepInfo a = ref.step(1e-2f, rb), b = split.step(1e-2f, sb);
    ASSERT_EQ(a.grad_norm, b.grad_norm);
    for (size_t u = 0; u < us.size(); ++u)
      for (size_t i = 0; i < p[u].size(); ++i) {
        ASSERT_EQ(f32_bits(join_master(hi[u][i], lo[u][i])), f32_bits(p[u][i])) << "step " << step << " unit " << u << " i " << i;
        // The streaming copy differs from round-to-nearest-even only at exact ties.
        if ((f32_bits(p[u][i]) & 0xffffu) != 0x8000u) {
          ASSERT_EQ(hi[u][i], copy[u][i]);
        }
      }
  }
}

TEST_P(MasterFormats, StochasticRoundingIsIndependentOfThreadsAndChunks) {
  const Isa isa = GetParam();
  if (!isa_supported(isa)) GTEST_SKIP() << "CPU lacks " << isa_name(isa);
  auto run = [&](int threads, int64_t chunk, uint64_t seed) {
    AdamWConfig c = config(MasterFormat::Bf16Sr, isa);
    c.threads = threads;
    c.chunk_elems = chunk;
    c.sr_seed = seed;
    CpuAdamW opt(units(), c);
    const auto us = units();
    std::vector<std::vector<bf16_t>> w(us.size());
    std::vector<std::vector<float>> g(us.size());
    for (size_t u = 0; u < us.size(); ++u) {
      auto p = randn(us[u].numel, 7 + u, 0.05f);
      for (float x : p) w[u].push_back(f32_to_bf16(x));
    }
    for (int step = 0; step < 4; ++step) {
      std::vector<UnitBuffers> b(us.size());
      for (size_t u = 0; u < us.size(); ++u) {
        g[u] = randn(us[u].numel, 50 * step + u, 0.3f);
        b[u] = UnitBuffers{nullptr, g[u].data(), w[u].data(), nullptr, nullptr};
      }
      opt.step(1e-3f, b);
    }
    return w;
  };
  const auto a = run(1, 1 << 18, 5), b = run(4, 256, 5), c = run(2, 1024, 6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);  // another seed rounds differently
}

TEST(MasterFormats, BuffersThatDoNotMatchTheFormatAreRejected) {
  CpuAdamW opt(units(), config(MasterFormat::Split, Isa::Scalar));
  std::vector<float> p(size_t(units()[0].numel)), g(p.size());
  opt.begin_step(1e-3f);
  try {
    opt.submit(0, UnitBuffers{p.data(), g.data(), nullptr, nullptr, nullptr});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("split masters need"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, MasterFormats, ::testing::Values(Isa::Scalar, Isa::Avx2, Isa::Avx512),
                         [](const auto& i) { return std::string(isa_name(i.param)); });

}  // namespace
}  // namespace lt::optim
