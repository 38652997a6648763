// Kept internals (Backend::layer_forward_keep / layer_backward_kept, ExecPlan::kept_layers): a layer's
// backward from the internals its forward kept gives what the plain backward (which re-runs them) gives,
// for every layer kind, also when other layers ran in between and clobbered the shared workspace (as in a
// training step, where the kept layer's backward comes after the head and the later layers' backward).
// Not bit-identical only where the plain backward is not either: the attention backward adds dQ with fp32
// atomics (the two runs of the same backward differ by as much: checked beside).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "gpu_test_util.h"
#include "hybrid_test_util.h"

using namespace lt;
using namespace lt::gputest;

namespace {

ModelConfig dense_config(Arch arch) {
  ModelConfig c;
  c.name = "dense";
  c.arch = arch;
  c.hidden = 256;
  c.layers = 2;
  c.ffn = 512;
  c.vocab = 1000;
  c.rms_eps = 1e-6;
  c.rope_theta = 1e6;
  if (arch == Arch::Qwen2) {
    c.heads = 4, c.kv_heads = 2, c.head_dim = 64, c.attn_bias = true;
  } else {
    c.heads = 2, c.kv_heads = 1, c.head_dim = 128, c.qk_norm = true;
  }
  return c;
}

struct Outs {
  std::vector<float> y, dx, dw;
};

struct KeptCase {
  std::string name;
  int64_t batch, seq;
  bool packed;
  int64_t mlp_bound = 0;  // > 0: the MLP in passes of at most this many rows (the kept gate/up output stays whole)
};
class KeptInternals : public ::testing::TestWithParam<KeptCase> {};

ModelConfig config_of(const std::string& name) {
  if (name == "qwen2") return dense_config(Arch::Qwen2);
  if (name == "qwen3") return dense_config(Arch::Qwen3);
  return hybrid_config(name);  // "hd64", "hd128", "hd256", "hd64_h72": layer 0 Gated DeltaNet, layer 1 attention
}

TEST_P(KeptInternals, BackwardFromKeptEqualsReRun) {
  REQUIRE_GPU();
  const KeptCase kc = GetParam();
  const ModelConfig c = config_of(kc.name);
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(4) << 30;
  CudaBackend be(c, o);
  if (kc.mlp_bound > 0) be.set_mlp_pass_bound(kc.mlp_bound);
  const int64_t T = kc.batch * kc.seq, H = c.hidden;
  std::mt19937 rng(5);
  std::vector<int32_t> seg(sz(T)), pos(sz(T));
  for (int64_t b = 0; b < kc.batch; ++b)
    for (int64_t s = 0; s < kc.seq; ++s) {
      const int32_t sg = s < kc.seq / 3 ? 0 : 1;
      seg[sz(b * kc.seq + s)] = sg;
      pos[sz(b * kc.seq + s)] = int32_t(sg == 0 ? s : s - kc.seq / 3);
    }
  DevBuf dseg = up(seg), dpos = up(pos);
  const DevGeometry g{kc.batch, kc.seq, kc.packed ? dpos.as<int32_t>() : nullptr,
                      kc.packed ? dseg.as<int32_t>() : nullptr};
  // Both layers' weights and inputs; layer `j` is checked, the other one clobbers the workspace.
  std::vector<DevBuf> w, x;
  for (int64_t j = 0; j < 2; ++j) {
    w.push_back(up_bf16(unit_weights(be.layout().layer(j), rng)));
    x.push_back(up_bf16(round_bf16(randn(sz(T * H), rng))));
  }
  DevBuf dy = up_bf16(round_bf16(randn(sz(T * H), rng, 0.1f)));
  for (int64_t j = 0; j < 2; ++j) {
    const int64_t n = be.layout().layer(j).numel, other = 1 - j;
    const int64_t kb = be.layer_keep_bytes(j, kc.batch, kc.seq);
    ASSERT_GT(kb, 0);
    if (kc.mlp_bound == 0)  // in MLP passes the workspace holds one pass of the gate/up output, the kept part all
      EXPECT_LT(kb, be.layer_workspace_bytes(T, kc.seq)) << "the kept part is a part of the workspace";
    DevBuf keep(sz(kb)), y(sz(T * H * 2)), dx(sz(T * H * 2)), dw(sz(n * 4)), oy(sz(T * H * 2)), odx(sz(T * H * 2)),
        odw(sz(be.layout().layer(other).numel * 4));
    auto run = [&](bool kept) {
      cudaMemset(dw.p, 0, sz(n * 4));
      if (kept) {
        be.layer_forward_keep(j, w[sz(j)].p, g, x[sz(j)].p, y.p, keep.p, {});
        // The other layer's forward and backward in between, on the shared workspace.
        be.layer_forward(other, w[sz(other)].p, g, x[sz(other)].p, oy.p, {});
        cudaMemset(odw.p, 0, odw.bytes);
        be.layer_backward(other, w[sz(other)].p, g, x[sz(other)].p, dy.p, odx.p, odw.p, {});
        be.layer_backward_kept(j, w[sz(j)].p, g, x[sz(j)].p, dy.p, dx.p, dw.p, keep.p, {});
      } else {
        be.layer_forward(j, w[sz(j)].p, g, x[sz(j)].p, y.p, {});
        be.layer_backward(j, w[sz(j)].p, g, x[sz(j)].p, dy.p, dx.p, dw.p, {});
      }
      be.synchronize();
      return Outs{down_bf16(y.p, sz(T * H)), down_bf16(dx.p, sz(T * H)), down<float>(dw.p, sz(n))};
    };
    const Outs ref = run(false), ref2 = run(false), got = run(true);
    const std::string what = kc.name + " layer " + std::to_string(j) + " (" +
                             layer_kind_short_name(c.kind(j)) + ")";
    EXPECT_EQ(got.y, ref.y) << what << ": the kept forward's output";
    // The plain backward's own run-to-run spread, and the kept one within a small multiple of it.
    const double spread_dx = rel_err(ref2.dx, ref.dx), spread_dw = rel_err(ref2.dw, ref.dw);
    const double edx = rel_err(got.dx, ref.dx), edw = rel_err(got.dw, ref.dw);
    EXPECT_LE(edx, std::max(4 * spread_dx, 1e-6)) << what << ": dx (re-run spread " << spread_dx << ")";
    EXPECT_LE(edw, std::max(4 * spread_dw, 1e-6)) << what << ": dw (re-run spread " << spread_dw << ")";
    for (auto& p : be.layout().layer(j).params) {
      const double cs = cosine(got.dw.data() + p.offset, ref.dw.data() + p.offset, sz(p.numel));
      EXPECT_GE(cs, 0.99999) << what << ": " << p.suffix;
    }
    std::printf("[kept] %s: keep %.2f MiB of a %.2f MiB workspace; dx rel %.2e (spread %.2e), dw rel %.2e (spread %.2e)\n",
                what.c_str(), double(kb) / (1 << 20), double(be.layer_workspace_bytes(T, kc.seq)) / (1 << 20), edx,
                spread_dx, edw, spread_dw);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, KeptInternals,
                         ::testing::Values(KeptCase{"qwen2", 2, 100, false}, KeptCase{"qwen3", 2, 70, true},
                                           KeptCase{"hd64", 2, 130, true}, KeptCase{"hd128", 1, 200, false},
                                           KeptCase{"hd256", 2, 64, true}, KeptCase{"hd64_h72", 2, 70, true},
                                           KeptCase{"qwen2", 2, 100, false, 64}, KeptCase{"hd64", 2, 130, true, 64}),
                         [](const auto& info) {
                           return info.param.name + "_B" + std::to_string(info.param.batch) + "_S" +
                                  std::to_string(info.param.seq) + (info.param.packed ? "_packed" : "") +
                                  (info.param.mlp_bound > 0 ? "_mlp" + std::to_string(info.param.mlp_bound) : "");
                         });

// A backend that is asked for a layer outside the model names it.
TEST(KeptInternalsApi, BadLayerIsAnError) {
  REQUIRE_GPU();
  const ModelConfig c = dense_config(Arch::Qwen2);
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(1) << 30;
  CudaBackend be(c, o);
  EXPECT_THROW(be.layer_keep_bytes(2, 1, 16), Error);
  EXPECT_GT(be.layer_keep_bytes(1, 2, 16), be.layer_keep_bytes(1, 1, 16));
}

}  // namespace
