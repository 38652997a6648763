// Each CUDA kernel against the fp32 CPU reference (src/backend/cpu/ops.h), forward and backward,
// on bf16-rounded inputs, at edge shapes too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "backend/cpu/ops.h"
#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/kernel_options.h"
#include "backend/cuda/kernels.h"
#include "attn_test_util.h"
#include "gpu_test_util.h"

using namespace lt;
using namespace lt::gputest;

namespace {

// ------------------------------------------------------------------------------------------- GEMM
struct GemmCase {
  bool ta, tb, f32, bias, accumulate;
};
class GemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmTest, MatchesCpu) {
  REQUIRE_GPU();
  const GemmCase gc = GetParam();
  const int64_t m = 77, n = 130, k = 96;
  std::mt19937 rng(1);
  auto A = round_bf16(randn(sz(m * k), rng)), B = round_bf16(randn(sz(k * n), rng));
  auto bias = round_bf16(randn(sz(n), rng));
  auto C0 = gc.f32 ? randn(sz(m * n), rng) : round_bf16(randn(sz(m * n), rng));
  std::vector<float> ref = C0;
  const float beta = gc.accumulate ? 1.f : 0.f;
  cpu::sgemm(gc.ta, gc.tb, m, n, k, 1.f, A.data(), gc.ta ? m : k, B.data(), gc.tb ? k : n, beta, ref.data(), n);
  if (gc.bias)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) ref[sz(i * n + j)] += bias[sz(j)];
  DevBuf dA = up_bf16(A), dB = up_bf16(B), dbias = up_bf16(bias);
  DevBuf dC = gc.f32 ? up(C0) : up_bf16(C0);
  DevBuf ws(cuda::Gemm::kWorkspaceBytes);
  cuda::Gemm g(ws.p, ws.bytes);
  cuda::GemmArgs a;
  a.trans_a = gc.ta, a.trans_b = gc.tb, a.m = m, a.n = n, a.k = k;
  a.a = dA.p, a.b = dB.p, a.c = dC.p, a.c_f32 = gc.f32, a.beta = beta, a.bias = gc.bias ? dbias.p : nullptr;
  g.run(a, nullptr);
  auto got = gc.f32 ? down<float>(dC.p, sz(m * n)) : down_bf16(dC.p, sz(m * n));
  EXPECT_LE(rel_err(got, ref), gc.f32 ? 1e-5 : 8e-3);
}
TEST(Gemm, ResidualInputFusedAsBetaTerm) {
  REQUIRE_GPU();
  const int64_t m = 64, n = 96, k = 80;
  std::mt19937 rng(4);
  auto A = round_bf16(randn(sz(m * k), rng)), B = round_bf16(randn(sz(n * k), rng)), R = round_bf16(randn(sz(m * n), rng));
  std::vector<float> ref = R;
  cpu::sgemm(false, true, m, n, k, 1.f, A.data(), k, B.data(), k, 1.f, ref.data(), n);
  DevBuf dA = up_bf16(A), dB = up_bf16(B), dR = up_bf16(R), dC(sz(m * n) * 2), ws(cuda::Gemm::kWorkspaceBytes);
  cuda::Gemm g(ws.p, ws.bytes);
  cuda::GemmArgs a;
  a.trans_b = true, a.m = m, a.n = n, a.k = k, a.a = dA.p, a.b = dB.p, a.c = dC.p, a.beta = 1.f, a.c_in = dR.p;
  g.run(a, nullptr);
  EXPECT_LE(rel_err(down_bf16(dC.p, sz(m * n)), ref), 8e-3);
  EXPECT_EQ(rel_err(down_bf16(dR.p, sz(m * n)), R), 0.0);  // the residual input is untouched
}

INSTANTIATE_TEST_SUITE_P(All, GemmTest,
                         ::testing::Values(GemmCase{false, true, false, false, false}, GemmCase{false, true, false, true, false},
                                           GemmCase{false, false, false, false, true}, GemmCase{true, false, true, false, true},
                                           GemmCase{true, true, true, false, false}, GemmCase{false, false, true, false, false}));

// -------------------------------------------------------------------------------------- attention
class AttnTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttnTest, ForwardBackwardMatchCpu) {
  REQUIRE_GPU();
  const AttnCase ac = GetParam();
  const int64_t H = ac.heads, T = ac.tokens();
  const AttnRef r = attention_reference(ac);
  DevBuf dq_ = up_bf16(r.q), dk_ = up_bf16(r.k), dv_ = up_bf16(r.v), ddo = up_bf16(r.dout), dseg = up(r.seg);
  DevBuf o(r.q.size() * 2), lse(sz(T * H) * 4), gq(r.q.size() * 2), gk(r.k.size() * 2), gv(r.v.size() * 2);
  DevBuf dq_acc(r.q.size() * 4), delta(sz(T * H) * 4), dkv(r.k.size() * 8);
  cuda::AttnDims d{ac.batch, ac.seq, H, ac.kv_heads, ac.hd, r.scale};
  const int32_t* sp = ac.segments ? dseg.as<int32_t>() : nullptr;
  cuda::attention_fwd(d, dq_.p, dk_.p, dv_.p, sp, o.p, lse.as<float>(), nullptr);
  cuda::attention_bwd(d, dq_.p, dk_.p, dv_.p, sp, o.p, lse.as<float>(), ddo.p, gq.p, gk.p, gv.p, dq_acc.as<float>(),
                      delta.as<float>(), dkv.as<float>(), nullptr);
  GT_CUDA(cudaDeviceSynchronize());
  expect_attention_close(ac, r, down_bf16(o.p, r.q.size()), down<float>(lse.p, sz(T * H)), r.lse_rows,
                         down_bf16(gq.p, r.q.size()), down_bf16(gk.p, r.k.size()), down_bf16(gv.p, r.v.size()));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttnTest,
    ::testing::Values(AttnCase{2, 100, 4, 4, 64, false}, AttnCase{1, 257, 8, 1, 128, false},
                      AttnCase{2, 130, 4, 2, 128, true}, AttnCase{1, 1, 4, 2, 64, false},
                      AttnCase{1, 1, 2, 1, 128, false}, AttnCase{3, 64, 6, 3, 64, true},
                      AttnCase{1, 200, 8, 2, 64, false}, AttnCase{2, 192, 4, 4, 128, false},
                      AttnCase{2, 50, 4, 2, 32, true}, AttnCase{1, 33, 8, 1, 8, false},
                      AttnCase{1, 70, 4, 4, 16, false},
                      // GQA groups of 7 (uneven split of the group's heads over a cluster), > 1 key tile
                      AttnCase{1, 300, 14, 2, 64, true}, AttnCase{2, 260, 7, 1, 128, false}),
    [](const auto& info) {
      std::ostringstream s;
      s << info.param;
      return s.str();
    });

// Head dim 256 (Qwen3.5/3.6 full attention): the flash forward + warp-pair backward on sm_90, the
// generic kernels elsewhere; GQA 6 as in the 27B model, packed segments, several key tiles, one row.
INSTANTIATE_TEST_SUITE_P(
    HybridHd256, AttnTest,
    ::testing::Values(AttnCase{2, 130, 6, 1, 256, true}, AttnCase{1, 257, 24, 4, 256, false},
                      AttnCase{1, 1, 2, 1, 256, false}, AttnCase{3, 64, 4, 2, 256, true}),
    [](const auto& info) {
      std::ostringstream s;
      s << info.param;
      return s.str();
    });

// Determinism of dK/dV on the tensor-core path (no atomics there).
TEST(Attention, KeyValueGradientsAreDeterministic) {
  REQUIRE_GPU();
  const int64_t B = 2, S = 300, H = 8, KV = 2, D = 128, T = B * S;
  std::mt19937 rng(5);
  DevBuf q = up_bf16(randn(sz(T * H * D), rng)), k = up_bf16(randn(sz(T * KV * D), rng));
  DevBuf v = up_bf16(randn(sz(T * KV * D), rng)), dO = up_bf16(randn(sz(T * H * D), rng));
  DevBuf o(sz(T * H * D) * 2), lse(sz(T * H) * 4), acc(sz(T * H * D) * 4), delta(sz(T * H) * 4);
  cuda::AttnDims d{B, S, H, KV, D, 0.088f};
  cuda::attention_fwd(d, q.p, k.p, v.p, nullptr, o.p, lse.as<float>(), nullptr);
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {
    DevBuf gq(sz(T * H * D) * 2), gk(sz(T * KV * D) * 2), gv(sz(T * KV * D) * 2);
    cuda::attention_bwd(d, q.p, k.p, v.p, nullptr, o.p, lse.as<float>(), dO.p, gq.p, gk.p, gv.p, acc.as<float>(),
                        delta.as<float>(), nullptr, nullptr);
    auto a = down_bf16(gk.p, sz(T * KV * D)), b = down_bf16(gv.p, sz(T * KV * D));
    a.insert(a.end(), b.begin(), b.end());
    if (rep == 0) first = a;
    else EXPECT_EQ(std::memcmp(first.data(), a.data(), a.size() * 4), 0);
  }
}

// ------------------------------------------------------------------------------------------ norms
// Both backward paths (KernelOptions::norm_bwd): the fused one takes dim >= 1024 in 1..4 passes of 2,048 columns
// (1,024; 3,584 and 5,120 end in a partial pass; 8,192 in four), rows fewer than, equal to and more than its blocks.
TEST(RmsNorm, ForwardBackwardMatchCpu) {
  REQUIRE_GPU();
  for (const bool fused : {true, false}) {
    cuda::KernelOptions ko = cuda::kernel_options();
    ko.norm_bwd = fused ? cuda::NormBwd::Fused : cuda::NormBwd::Split;
    const cuda::KernelOptionsScope scope(ko);
    for (auto [rows, dim] : {std::pair<int64_t, int64_t>{37, 264}, {1, 4096}, {300, 128}, {5, 8}, {613, 5120},
                             {1000, 1024}, {67, 8192}, {2051, 3584}}) {
      std::mt19937 rng{uint32_t(rows + dim)};
      auto x = round_bf16(randn(sz(rows * dim), rng, 2.f)), w = round_bf16(randn(sz(dim), rng, 0.3f, 1.f));
      auto dy = round_bf16(randn(sz(rows * dim), rng)), dres = round_bf16(randn(sz(rows * dim), rng));
      auto dw0 = randn(sz(dim), rng);
      const bool with_res = rows != 67;  // and once without the residual gradient
      std::vector<float> y_ref(x.size()), dx_ref = with_res ? dres : std::vector<float>(x.size(), 0.f), dw_ref = dw0;
      cpu::rmsnorm_fwd(x.data(), w.data(), rows, dim, 1e-6f, y_ref.data());
      cpu::rmsnorm_bwd(x.data(), w.data(), dy.data(), rows, dim, 1e-6f, dx_ref.data(), dw_ref.data(), true);
      DevBuf dx_ = up_bf16(x), dw_ = up_bf16(w), ddy = up_bf16(dy), ddres = up_bf16(dres), ddw = up(dw0);
      DevBuf y(x.size() * 2), gx(x.size() * 2), rstd(sz(rows) * 4), part(sz(cuda::norm_partial_floats(dim)) * 4);
      cuda::rmsnorm_fwd(dx_.p, dw_.p, rows, dim, 1e-6f, y.p, nullptr, nullptr);
      cuda::rmsnorm_bwd(dx_.p, dw_.p, ddy.p, with_res ? ddres.p : nullptr, rows, dim, 1e-6f, gx.p, ddw.as<float>(),
                        rstd.as<float>(), part.as<float>(), nullptr);
      const std::string at = std::to_string(rows) + "x" + std::to_string(dim) + (fused ? " fused" : " split");
      EXPECT_LE(rel_err(down_bf16(y.p, x.size()), y_ref), 8e-3) << at;
      EXPECT_LE(rel_err(down_bf16(gx.p, x.size()), dx_ref), 8e-3) << at;
      EXPECT_LE(rel_err(down<float>(ddw.p, sz(dim)), dw_ref), 1e-4) << at;
    }
  }
}

TEST(ColumnSum, MatchesCpuAndIsDeterministic) {
  REQUIRE_GPU();
  const int64_t rows = 5000, dim = 72;
  std::mt19937 rng(3);
  auto a = round_bf16(randn(sz(rows * dim), rng));
  std::vector<double> ref(sz(dim), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dim; ++c) ref[sz(c)] += a[sz(r * dim + c)];
  DevBuf da = up_bf16(a), part(sz(cuda::norm_partial_floats(dim)) * 4);
  DevBuf db = up(std::vector<float>(sz(dim), 0.f)), db2 = up(std::vector<float>(sz(dim), 0.f));
  cuda::colsum_accum(da.p, rows, dim, db.as<float>(), part.as<float>(), nullptr);
  cuda::colsum_accum(da.p, rows, dim, db2.as<float>(), part.as<float>(), nullptr);
  auto g = down<float>(db.p, sz(dim)), g2 = down<float>(db2.p, sz(dim));
  for (int64_t c = 0; c < dim; ++c) EXPECT_NEAR(g[sz(c)], ref[sz(c)], 1e-3 * (1 + std::fabs(ref[sz(c)])));
  EXPECT_EQ(std::memcmp(g.data(), g2.data(), g.size() * 4), 0);
}

// ------------------------------------------------------------------------------------------- RoPE
TEST(Rope, Llama3ScalingMatchesCpuAndInverts) {
  REQUIRE_GPU();
  RopeScaling rs;
  rs.type = "llama3";
  rs.factor = 32;
  rs.low_freq_factor = 1;
  rs.high_freq_factor = 4;
  rs.original_max_position_embeddings = 8192;
  for (int64_t hd : {64, 128}) {
    const int64_t rows = 50, heads = 3;
    const auto inv = cpu::rope_inv_freq(hd, 500000.0, rs);
    std::mt19937 rng{uint32_t(hd)};
    auto x = round_bf16(randn(sz(rows * heads * hd), rng));
    std::vector<int32_t> pos(sz(rows));
    for (int64_t r = 0; r < rows; ++r) pos[sz(r)] = int32_t((r * 977) % 20000);
    auto ref = x;
    cpu::rope_fwd(ref.data(), rows, heads, hd, pos.data(), inv.data());
    DevBuf dx = up_bf16(x), dpos = up(pos), dinv = up(inv);
    cuda::rope_apply(dx.p, nullptr, rows, heads, hd, dpos.as<int32_t>(), 0, dinv.as<float>(), false, nullptr);
    EXPECT_LE(rel_err(down_bf16(dx.p, x.size()), ref), 8e-3) << hd;
    cuda::rope_apply(dx.p, nullptr, rows, heads, hd, dpos.as<int32_t>(), 0, dinv.as<float>(), true, nullptr);
    EXPECT_LE(rel_err(down_bf16(dx.p, x.size()), x), 1.5e-2) << hd;
    // Backward from fp32 input == cpu rope_bwd.
    auto g = randn(x.size(), rng), gref = g;
    cpu::rope_bwd(gref.data(), rows, heads, hd, pos.data(), inv.data());
    DevBuf dg = up(g), out(x.size() * 2);
    cuda::rope_apply(out.p, dg.as<float>(), rows, heads, hd, dpos.as<int32_t>(), 0, dinv.as<float>(), true, nullptr);
    EXPECT_LE(rel_err(down_bf16(out.p, x.size()), gref), 8e-3) << hd;
  }
}

// ----------------------------------------------------------------------------------------- SwiGLU
TEST(SwiGlu, ForwardBackwardMatchCpu) {
  REQUIRE_GPU();
  for (int64_t f : {int64_t(250), int64_t(256)}) {  // pairwise and 8-wide kernels
  const int64_t rows = 33;
  std::mt19937 rng(9);
  auto gu = round_bf16(randn(sz(rows * 2 * f), rng, 2.f)), dact = round_bf16(randn(sz(rows * f), rng));
  std::vector<float> gate(sz(rows * f)), upv(sz(rows * f));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < f; ++c) {
      gate[sz(r * f + c)] = gu[sz(r * 2 * f + c)];
      upv[sz(r * f + c)] = gu[sz(r * 2 * f + f + c)];
    }
  std::vector<float> act(sz(rows * f)), dg(sz(rows * f)), du(sz(rows * f));
  cpu::swiglu_fwd(gate.data(), upv.data(), rows, f, act.data());
  cpu::swiglu_bwd(gate.data(), upv.data(), dact.data(), rows, f, dg.data(), du.data());
  DevBuf dgu = up_bf16(gu), dda = up_bf16(dact), a(sz(rows * f) * 2), g(gu.size() * 2);
  cuda::swiglu_fwd(dgu.p, rows, f, a.p, nullptr);
  cuda::swiglu_bwd(dgu.p, dda.p, rows, f, g.p, nullptr);
  EXPECT_LE(rel_err(down_bf16(a.p, act.size()), act), 8e-3);
  auto got = down_bf16(g.p, gu.size());
  std::vector<float> gg(sz(rows * f)), gu2(sz(rows * f));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < f; ++c) {
      gg[sz(r * f + c)] = got[sz(r * 2 * f + c)];
      gu2[sz(r * f + c)] = got[sz(r * 2 * f + f + c)];
    }
  EXPECT_LE(rel_err(gg, dg), 8e-3) << f;
  EXPECT_LE(rel_err(gu2, du), 8e-3) << f;
  }
}

// -------------------------------------------------------------------------------------- embedding
TEST(Embedding, ForwardAndDeterministicBackward) {
  REQUIRE_GPU();
  const int64_t V = 1000, Hd = 96, n = 4000;
  std::mt19937 rng(11);
  auto emb = round_bf16(randn(sz(V * Hd), rng));
  std::vector<int32_t> ids(sz(n));
  for (auto& i : ids) i = int32_t(rng() % 50);  // many repeats
  ids[7] = 999;
  auto dx = round_bf16(randn(sz(n * Hd), rng));
  std::vector<float> x_ref(sz(n * Hd)), demb_ref(sz(V * Hd), 0.5f);
  cpu::embedding_fwd(emb.data(), V, Hd, ids.data(), n, x_ref.data());
  cpu::embedding_bwd(ids.data(), n, Hd, dx.data(), demb_ref.data());
  DevBuf demb = up_bf16(emb), dids = up(ids), x(sz(n * Hd) * 2), ddx = up_bf16(dx);
  DevBuf err = up(std::vector<int>{0});
  cuda::embed_fwd(demb.p, dids.as<int32_t>(), n, Hd, V, x.p, err.as<int>(), nullptr);
  EXPECT_EQ(rel_err(down_bf16(x.p, x_ref.size()), x_ref), 0.0);
  EXPECT_EQ(down<int>(err.p, 1)[0], 0);
  const int64_t wsb = cuda::embed_bwd_workspace_bytes(n);
  DevBuf ws(sz(wsb));
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {
    DevBuf g = up(std::vector<float>(sz(V * Hd), 0.5f));
    cuda::embed_bwd(dids.as<int32_t>(), n, Hd, V, ddx.p, g.as<float>(), ws.p, wsb, nullptr);
    auto got = down<float>(g.p, sz(V * Hd));
    EXPECT_LE(rel_err(got, demb_ref), 1e-6);
    if (rep == 0) first = got;
    else EXPECT_EQ(std::memcmp(first.data(), got.data(), got.size() * 4), 0);
  }
  ids[3] = int32_t(V);  // out of range
  DevBuf bad = up(ids);
  cuda::embed_fwd(demb.p, bad.as<int32_t>(), n, Hd, V, x.p, err.as<int>(), nullptr);
  EXPECT_EQ(down<int>(err.p, 1)[0], 1);
}

// ---------------------------------------------------------------------------------- cross-entropy
TEST(CrossEntropy, LossAndGradientMatchCpu) {
  REQUIRE_GPU();
  const int64_t n = 37, V = 5000;
  std::mt19937 rng(13);
  for (int mode = 0; mode < 2; ++mode) {  // 0: some ignored, 1: all ignored
    auto logits = randn(sz(n * V), rng, 3.f);
    std::vector<int32_t> tg(sz(n));
    for (int64_t i = 0; i < n; ++i) tg[sz(i)] = (mode == 1 || i % 5 == 0) ? -100 : int32_t(rng() % V);
    auto ref = logits;
    double loss = 0;
    int64_t nv = 0;
    cpu::cross_entropy(ref.data(), tg.data(), n, V, 0.25f, true, &loss, &nv);
    DevBuf dl = up(logits), dt = up(tg), dg(sz(n * V) * 2), rl(sz(n) * 4);
    DevBuf acc = up(std::vector<double>{1.0, 2.0}), err = up(std::vector<int>{0});
    cuda::cross_entropy(dl.as<float>(), dt.as<int32_t>(), n, V, 0.25f, dg.p, rl.as<float>(), err.as<int>(), nullptr);
    cuda::loss_accumulate(rl.as<float>(), dt.as<int32_t>(), n, acc.as<double>(), nullptr);
    auto a = down<double>(acc.p, 2);
    EXPECT_NEAR(a[0] - 1.0, loss, 1e-4 * (1 + loss)) << mode;
    EXPECT_EQ(a[1] - 2.0, double(nv)) << mode;
    auto g = down_bf16(dg.p, sz(n * V));
    if (mode == 1) {
      EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.f; }));
      EXPECT_EQ(nv, 0);
    } else {
      EXPECT_LE(rel_err(g, ref), 8e-3);
    }
    EXPECT_EQ(down<int>(err.p, 1)[0], 0);
  }
}

// ------------------------------------------------------------------------------------- reductions
TEST(Reductions, SumOfSquaresIsExactEnoughAndDeterministic) {
  REQUIRE_GPU();
  std::mt19937 rng(17);
  for (int64_t n : {int64_t(1), int64_t(1000), int64_t(3'000'001)}) {
    auto g = randn(sz(n), rng);
    double ref = 0;
    for (float v : g) ref += double(v) * v;
    DevBuf dg = up(g), out = up(std::vector<double>{0.5}), part(cuda::kSumsqBlocks * 8);
    cuda::sumsq_accum(dg.as<float>(), n, out.as<double>(), part.as<double>(), nullptr);
    const double a = down<double>(out.p, 1)[0];
    cuda::sumsq_accum(dg.as<float>(), n, out.as<double>(), part.as<double>(), nullptr);
    const double b = down<double>(out.p, 1)[0];
    EXPECT_NEAR(a - 0.5, ref, 1e-9 * ref) << n;
    EXPECT_EQ(b - a, a - 0.5) << n;  // the same sum again, bit for bit
  }
}

}  // namespace
