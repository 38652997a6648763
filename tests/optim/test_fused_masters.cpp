// The AVX-512 kernels (8-bit and fp32 moments) with the masters' and gradients' conversions fused in
// (adamw_q8_fused, adamw_f32_fused) equal the tile path (join/widen into fp32 scratch, the fp32-master kernel, split/round back) bit for bit:
// masters, remainders, bf16 copies and moments, on sizes that leave partial blocks and vector tails and
// cut tiles inside work items, with special master values (zeros, subnormals, inf, NaN payloads, ties).
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "core/split_master.h"
#include "helpers.h"
#include "optim/master_tiles.h"
#include "optim/optimizer.h"

namespace lt::optim {
namespace {

using test::make_unit;
using test::randn;

std::vector<UnitSpec> units() {
  return {make_unit({1, 255, 257, 2 * kMasterTile + 300, 40000, 700},
                    {StateFormat::Q8, StateFormat::Q8, StateFormat::Q8, StateFormat::Q8, StateFormat::Q8,
                     StateFormat::F32},
                    {0, 1, 0, 0, 1, 0}),
          make_unit({3 * kMasterTile + 31, 2 * kMasterTile + 45}, {StateFormat::Q8, StateFormat::F32}, {0, 1})};
}

// One unit's buffers in every form; the masters start from the same fp32 values.
struct Masters {
  std::vector<float> p, g;
  std::vector<bf16_t> hi, g16;
  std::vector<uint16_t> lo;
  Masters(int64_t n, uint64_t seed) : p(randn(n, seed, 0.05f)), hi(size_t(n)), lo(size_t(n)) {
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu,
                                0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffa12345u, 0x7fc0ffffu, 0x7f80ffffu,
                                0x3f808000u, 0xbf818000u, 0x3f80ffffu};
    for (size_t k = 0; k < std::size(special); ++k) p[(k * 977) % p.size()] = bits_f32(special[k]);
    split_tile(p.data(), hi.data(), lo.data(), n);
  }
  UnitBuffers buffers(MasterFormat f, bool bf16_grad, int64_t step) {
    g = randn(int64_t(p.size()), 1000 + uint64_t(step), 0.3f);
    for (size_t i = 0; i < g.size(); i += 13) g[i] = 0;
    g16.resize(g.size());
    for (size_t i = 0; i < g.size(); ++i) g16[i] = f32_to_bf16(g[i]);
    UnitBuffers b;
    b.master = f == MasterFormat::F32 ? p.data() : nullptr;
    b.bf16 = hi.data();
    b.lo = f == MasterFormat::Split ? lo.data() : nullptr;
    if (bf16_grad) b.grad_bf16 = g16.data();
    else b.grad = g.data();
    return b;
  }
};

class FusedMasters : public ::testing::TestWithParam<std::tuple<MasterFormat, bool, float>> {};

TEST_P(FusedMasters, EqualTheTilePathBitForBit) {
  if (!q8_avx512_kernel_available()) GTEST_SKIP() << "CPU lacks AVX-512 VBMI";  // (the 8-bit kernel's)
  const auto [format, bf16_grad, max_norm] = GetParam();
  const auto us = units();
  for (int64_t chunk : {int64_t(256), int64_t(kMasterTile + 3 * kQ8Block)}) {
    AdamWConfig c;
    c.isa = Isa::Avx512;
    c.master = format;
    c.threads = 2;
    c.chunk_elems = chunk;
    c.max_grad_norm = max_norm;
    c.sr_seed = 77;
    AdamWConfig tc = c;
    tc.fused_masters = false;
    CpuAdamW fused(us, c), tiles(us, tc);
    std::vector<Masters> a, b;
    for (size_t u = 0; u < us.size(); ++u) {
      a.emplace_back(us[u].numel, 5 + u);
      b.emplace_back(us[u].numel, 5 + u);
    }
    for (int64_t step = 1; step <= 4; ++step) {
      std::vector<UnitBuffers> ba, bb;
      for (size_t u = 0; u < us.size(); ++u) {
        ba.push_back(a[u].buffers(format, bf16_grad, step));
        bb.push_back(b[u].buffers(format, bf16_grad, step));
      }
      fused.step(1e-2f, ba);
      tiles.step(1e-2f, bb);
      for (size_t u = 0; u < us.size(); ++u) {
        const auto& x = a[u];
        const auto& y = b[u];
        ASSERT_EQ(std::memcmp(x.p.data(), y.p.data(), x.p.size() * 4), 0) << "step " << step << " unit " << u;
        ASSERT_EQ(x.hi, y.hi) << "step " << step << " unit " << u;
        ASSERT_EQ(x.lo, y.lo) << "step " << step << " unit " << u;
        for (size_t t = 0; t < us[u].tensors.size(); ++t) {
          std::vector<float> ma, va, mb, vb;
          fused.read_state(int(u), int(t), ma, va);
          tiles.read_state(int(u), int(t), mb, vb);
          ASSERT_EQ(ma, mb) << "step " << step << " unit " << u << " tensor " << t;
          ASSERT_EQ(va, vb) << "step " << step << " unit " << u << " tensor " << t;
        }
      }
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<FusedMasters::ParamType>& i) {
  const char* name[] = {"fp32", "split", "sr"};  // MasterFormat order
  return std::string(name[int(std::get<0>(i.param))]) + (std::get<1>(i.param) ? "_g16" : "_g32") +
         (std::get<2>(i.param) > 0 ? "_clip" : "");
}

INSTANTIATE_TEST_SUITE_P(
    Formats, FusedMasters,
    ::testing::Values(std::tuple{MasterFormat::Split, false, 0.5f}, std::tuple{MasterFormat::Split, true, 0.5f},
                      std::tuple{MasterFormat::Split, true, 0.0f}, std::tuple{MasterFormat::Bf16Sr, true, 0.5f},
                      std::tuple{MasterFormat::Bf16Sr, false, 0.0f}, std::tuple{MasterFormat::F32, true, 0.5f}),
    param_name);

}  // namespace
}  // namespace lt::optim
