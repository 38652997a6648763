// Decoder layer, head and embedding through the CudaBackend against the fp32 CPU reference
// (src/backend/cpu/reference.h) on the same bf16-rounded weights and inputs.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/reference.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "gpu_test_util.h"

using namespace lt;
using namespace lt::gputest;

namespace {

ModelConfig small_config(const std::string& kind) {
  ModelConfig c;
  c.name = kind;
  c.hidden = 256;
  c.layers = 2;
  c.ffn = 512;
  c.vocab = 1000;
  c.rms_eps = 1e-6;
  if (kind == "qwen2") {
    c.arch = Arch::Qwen2;
    c.heads = 4, c.kv_heads = 2, c.head_dim = 64, c.attn_bias = true, c.rope_theta = 1e6;
  } else if (kind == "qwen3") {
    c.arch = Arch::Qwen3;
    c.heads = 2, c.kv_heads = 1, c.head_dim = 128, c.qk_norm = true, c.rope_theta = 1e6;
  } else {  // llama with llama3 rope scaling, GQA ratio 4
    c.arch = Arch::Llama;
    c.heads = 4, c.kv_heads = 1, c.head_dim = 64, c.rope_theta = 5e5;
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = 8;
    c.rope_scaling.original_max_position_embeddings = 64;
  }
  return c;
}

// Random unit weights: norms near 1, matrices ~ N(0, 0.05), rounded to bf16.
std::vector<float> unit_weights(const UnitLayout& lay, std::mt19937& rng) {
  std::vector<float> w(sz(lay.numel), 0.f);
  for (auto& p : lay.params) {
    const bool norm = p.suffix.find("norm") != std::string::npos;
    auto v = randn(sz(p.numel), rng, norm ? 0.1f : 0.05f, norm ? 1.f : 0.f);
    std::copy(v.begin(), v.end(), w.begin() + p.offset);
  }
  return round_bf16(w);
}

struct Dev {
  CudaBackend& be;
  std::vector<Allocation> allocs;
  void* put_bf16(const std::vector<float>& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
    return put_raw(h.data(), int64_t(h.size() * 2));
  }
  template <typename T>
  void* put(const std::vector<T>& v) {
    return put_raw(v.data(), int64_t(v.size() * sizeof(T)));
  }
  void* put_raw(const void* p, int64_t bytes) {
    allocs.push_back(be.alloc(MemKind::Device, std::max<int64_t>(bytes, 1), "test"));
    cudaMemcpy(allocs.back().ptr, p, size_t(bytes), cudaMemcpyHostToDevice);
    return allocs.back().ptr;
  }
  void* zeros(int64_t bytes) {
    allocs.push_back(be.alloc(MemKind::Device, std::max<int64_t>(bytes, 1), "test"));
    cudaMemset(allocs.back().ptr, 0, size_t(bytes));
    return allocs.back().ptr;
  }
  ~Dev() {
    be.synchronize();
    for (auto& a : allocs) be.free(a);
  }
};

struct LayerCase {
  std::string kind;
  int64_t batch, seq;
  bool packed;            // segments + explicit positions
  int64_t mlp_bound = 0;  // > 0: the MLP in passes of at most this many rows (CudaBackend::set_mlp_pass_bound)
};
class LayerTest : public ::testing::TestWithParam<LayerCase> {};

TEST_P(LayerTest, ForwardBackwardMatchCpuReference) {
  REQUIRE_GPU();
  const LayerCase lc = GetParam();
  const ModelConfig c = small_config(lc.kind);
  const ModelLayout layout = model_layout(c);
  const UnitLayout& lay = layout.layer(1);
  const int64_t T = lc.batch * lc.seq, H = c.hidden;
  std::mt19937 rng(21);
  auto w = unit_weights(lay, rng);
  auto x = round_bf16(randn(sz(T * H), rng)), dy = round_bf16(randn(sz(T * H), rng, 0.1f));
  std::vector<int32_t> seg(sz(T)), pos(sz(T));
  for (int64_t b = 0; b < lc.batch; ++b)
    for (int64_t s = 0; s < lc.seq; ++s) {
      const int32_t sg = int32_t(s < lc.seq / 3 ? 0 : (s < lc.seq * 3 / 4 ? 1 : 2));
      seg[sz(b * lc.seq + s)] = sg;
      const int64_t start = sg == 0 ? 0 : (sg == 1 ? lc.seq / 3 : lc.seq * 3 / 4);
      pos[sz(b * lc.seq + s)] = int32_t(s - start);
    }
  cpu::SeqGeometry g{lc.batch, lc.seq, lc.packed ? pos.data() : nullptr, lc.packed ? seg.data() : nullptr};
  std::vector<float> y_ref(sz(T * H)), dx_ref(sz(T * H)), dw_ref(sz(lay.numel), 0.f);
  cpu::layer_forward(c, lay, w.data(), g, x.data(), y_ref.data());
  cpu::layer_backward(c, lay, w.data(), g, x.data(), dy.data(), dx_ref.data(), dw_ref.data());

  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(4) << 30;
  CudaBackend be(c, o);
  if (lc.mlp_bound > 0) be.set_mlp_pass_bound(lc.mlp_bound);
  {
    Dev d{be};
    void* dw_ = d.put_bf16(w);
    void* dx_ = d.put_bf16(x);
    void* ddy = d.put_bf16(dy);
    void* y = d.zeros(T * H * 2);
    void* gx = d.zeros(T * H * 2);
    void* gw = d.zeros(lay.numel * 4);
    DevGeometry dg{lc.batch, lc.seq, lc.packed ? static_cast<const int32_t*>(d.put(pos)) : nullptr,
                   lc.packed ? static_cast<const int32_t*>(d.put(seg)) : nullptr};
    be.layer_forward(1, dw_, dg, dx_, y, {});
    be.layer_backward(1, dw_, dg, dx_, ddy, gx, gw, {});
    be.synchronize();
    EXPECT_LE(rel_err(down_bf16(y, sz(T * H)), y_ref), 1e-2);
    EXPECT_LE(rel_err(down_bf16(gx, sz(T * H)), dx_ref), 3e-2);
    auto gwh = down<float>(gw, sz(lay.numel));
    auto norm = [](const float* a, int64_t n) {
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += double(a[i]) * a[i];
      return std::sqrt(s);
    };
    double max_norm = 0;
    for (auto& p : lay.params) max_norm = std::max(max_norm, norm(dw_ref.data() + p.offset, p.numel));
    for (auto& p : lay.params) {
      if (norm(dw_ref.data() + p.offset, p.numel) < 1e-4 * max_norm) {
        // Mathematically zero (q/k path of a single-token sequence): only rounding noise may remain.
        EXPECT_LE(norm(gwh.data() + p.offset, p.numel), 1e-3 * max_norm) << p.suffix;
        continue;
      }
      const double cs = cosine(gwh.data() + p.offset, dw_ref.data() + p.offset, sz(p.numel));
      std::vector<float> a(gwh.begin() + p.offset, gwh.begin() + p.offset + p.numel);
      std::vector<float> r(dw_ref.begin() + p.offset, dw_ref.begin() + p.offset + p.numel);
      EXPECT_GE(cs, 0.995) << p.suffix;
      EXPECT_LE(rel_err(a, r), 5e-2) << p.suffix;
    }
    // Accumulation: a second backward doubles dw.
    be.layer_backward(1, dw_, dg, dx_, ddy, gx, gw, {});
    be.synchronize();
    auto gw2 = down<float>(gw, sz(lay.numel));
    std::vector<float> twice(gwh.size());
    for (size_t i = 0; i < twice.size(); ++i) twice[i] = 2 * gwh[i];
    EXPECT_LE(rel_err(gw2, twice), 1e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, LayerTest,
                         ::testing::Values(LayerCase{"qwen2", 2, 100, false}, LayerCase{"qwen3", 2, 70, false},
                                           LayerCase{"llama", 1, 130, true}, LayerCase{"qwen2", 3, 64, true},
                                           LayerCase{"qwen3", 1, 1, false}, LayerCase{"qwen2", 2, 100, false, 48},
                                           LayerCase{"llama", 1, 130, true, 64},
                                           // a long packed row (segments of ~5.5k, 6.8k and 4k), whole and in MLP
                                           // passes of 4,096 rows
                                           LayerCase{"qwen2", 1, 16384, true}, LayerCase{"llama", 1, 16384, true, 4096}),
                         [](const auto& info) {
                           return info.param.kind + "_B" + std::to_string(info.param.batch) + "_S" +
                                  std::to_string(info.param.seq) + (info.param.packed ? "_packed" : "") +
                                  (info.param.mlp_bound > 0 ? "_mlp" + std::to_string(info.param.mlp_bound) : "");
                         });

// An untied head's random inputs: its weights (lmv: the LM matrix's part), T bf16-exact rows and their targets, every
// 7th ignored (all with all_ignored).
struct HeadInputs {
  std::vector<float> hw, lmv, x;
  std::vector<int32_t> tg;
};
HeadInputs head_inputs(const ModelConfig& c, const UnitLayout& hl, int64_t T, uint32_t seed, bool all_ignored) {
  std::mt19937 rng(seed);
  HeadInputs in;
  in.hw = unit_weights(hl, rng);
  const float* lm = in.hw.data() + hl.find("lm_head.weight").offset;
  in.lmv.assign(lm, lm + c.vocab * c.hidden);
  in.x = round_bf16(randn(sz(T * c.hidden), rng));
  in.tg.resize(sz(T));
  for (int64_t t = 0; t < T; ++t) in.tg[sz(t)] = (all_ignored || t % 7 == 0) ? -100 : int32_t(rng() % c.vocab);
  return in;
}

TEST(Head, LossAndGradientsMatchCpuReference) {
  REQUIRE_GPU();
  for (int mode = 0; mode < 2; ++mode) {  // 0: some targets ignored; 1: all ignored
    ModelConfig c = small_config("qwen2");
    c.tied = false;
    const ModelLayout layout = model_layout(c);
    const UnitLayout& hl = layout.head();
    const int64_t T = 300, H = c.hidden, V = c.vocab;
    auto [hw, lmv, x, tg] = head_inputs(c, hl, T, 31, mode == 1);
    std::vector<float> dx_ref(sz(T * H)), dhw_ref(sz(hl.numel), 0.f), dlm_ref(sz(V * H), 0.f);
    const float scale = 1.f / 200;
    auto r = cpu::head_forward_backward(c, hl, hw.data(), lmv.data(), tg.data(), T, x.data(), scale, dx_ref.data(),
                                        dhw_ref.data(), dlm_ref.data());
    CudaBackendOptions o;
    o.gpu_mem_cap = int64_t(3) << 30;
    CudaBackend be(c, o);
    be.set_head_chunk_rows(128);  // several chunks
    Dev d{be};
    void* dhw = d.put_bf16(hw);
    const void* dlm = static_cast<const uint16_t*>(dhw) + hl.find("lm_head.weight").offset;
    void* dxx = d.put_bf16(x);
    void* dtg = d.put(tg);
    void* gx = d.zeros(T * H * 2);
    void* ghw = d.zeros(hl.numel * 4);
    void* glm = d.zeros(V * H * 4);
    void* acc = d.zeros(16);
    be.head_loss(dhw, dlm, static_cast<const int32_t*>(dtg), DevGeometry{3, 100, nullptr, nullptr}, dxx, scale, gx, ghw,
                 glm, static_cast<double*>(acc), {});
    be.synchronize();
    auto a = down<double>(acc, 2);
    EXPECT_EQ(int64_t(a[1]), r.n_tokens);
    EXPECT_NEAR(a[0], r.loss_sum, 1e-2 * std::max(1.0, std::fabs(r.loss_sum)));
    if (mode == 0) {
      EXPECT_LE(rel_err(down_bf16(gx, sz(T * H)), dx_ref), 3e-2);
      EXPECT_LE(rel_err(down<float>(glm, sz(V * H)), dlm_ref), 3e-2);
      auto g = down<float>(ghw, sz(hl.numel));
      const int64_t off = hl.find("norm.weight").offset;
      EXPECT_GE(cosine(g.data() + off, dhw_ref.data() + off, sz(H)), 0.99);
    } else {
      auto g = down_bf16(gx, sz(T * H));
      EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.f; }));
    }
  }
}

// The head's weight gradient by vocabulary slices (Backend::head_loss_lse + head_lm_grad_slice, uneven slices) is the
// full pass's: the loss, dX and the norm's gradient bit for bit (the same kernels), the LM weight's within the GEMMs'
// own rounding (each slice is a GEMM of another shape), both near the fp32 reference; lse as the reference's.
TEST(Head, GradientBySlicesIsTheFullPasssGradient) {
  REQUIRE_GPU();
  ModelConfig c = small_config("qwen2");
  c.tied = false;
  const ModelLayout layout = model_layout(c);
  const UnitLayout& hl = layout.head();
  const int64_t T = 300, H = c.hidden, V = c.vocab, S = 37, norm_off = hl.find("norm.weight").offset;
  auto [hw, lmv, x, tg] = head_inputs(c, hl, T, 37, false);
  std::vector<float> dx_ref(sz(T * H)), dn_ref(sz(H), 0.f), dlm_ref(sz(V * H), 0.f), lse_ref(sz(T));
  const float scale = 1.f / 200;
  cpu::head_forward_lse(c, hl, hw.data(), lmv.data(), tg.data(), T, x.data(), scale, dx_ref.data(), dn_ref.data(),
                        lse_ref.data());
  cpu::head_forward_backward(c, hl, hw.data(), lmv.data(), tg.data(), T, x.data(), scale, dx_ref.data(),
                             std::vector<float>(sz(hl.numel), 0.f).data(), dlm_ref.data());
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(3) << 30;
  CudaBackend be(c, o);
  ASSERT_TRUE(be.has_sliced_head_grad());
  be.set_head_chunk_rows(128);  // several chunks
  Dev d{be};
  void* dhw = d.put_bf16(hw);
  const void* dlm = static_cast<const uint16_t*>(dhw) + hl.find("lm_head.weight").offset;
  void* dxx = d.put_bf16(x);
  auto* dtg = static_cast<const int32_t*>(d.put(tg));
  const DevGeometry g{3, 100, nullptr, nullptr};
  void *gx = d.zeros(T * H * 2), *ghw = d.zeros(hl.numel * 4), *glm = d.zeros(V * H * 4), *acc = d.zeros(16);
  be.head_loss(dhw, dlm, dtg, g, dxx, scale, gx, ghw, glm, static_cast<double*>(acc), {});
  void *gx2 = d.zeros(T * H * 2), *gn2 = d.zeros(H * 4), *lse = d.zeros(T * 4), *acc2 = d.zeros(16);
  be.head_loss_lse(dhw, dlm, dtg, g, dxx, scale, gx2, gn2, static_cast<float*>(lse), static_cast<double*>(acc2), {});
  std::vector<float> sliced(sz(V * H));
  void* dw = d.zeros(S * H * 4);
  for (int64_t v0 = 0; v0 < V; v0 += S) {
    const int64_t nv = std::min(S, V - v0);
    be.fill_zero(Lane::Compute, dw, nv * H * 4, {});
    be.head_lm_grad_slice(dhw, dlm, dtg, g, dxx, static_cast<const float*>(lse), scale, v0, nv, dw, {});
    auto part = down<float>(dw, sz(nv * H));
    std::copy(part.begin(), part.end(), sliced.begin() + v0 * H);
  }
  be.synchronize();
  EXPECT_EQ(down<double>(acc, 2), down<double>(acc2, 2));
  EXPECT_EQ(down_bf16(gx, sz(T * H)), down_bf16(gx2, sz(T * H)));
  const auto full_hw = down<float>(ghw, sz(hl.numel));
  EXPECT_EQ(std::vector<float>(full_hw.begin() + norm_off, full_hw.begin() + norm_off + H), down<float>(gn2, sz(H)));
  EXPECT_LE(rel_err(sliced, down<float>(glm, sz(V * H))), 1e-5);
  EXPECT_LE(rel_err(sliced, dlm_ref), 3e-2);
  EXPECT_LE(rel_err(down<float>(lse, sz(T)), lse_ref), 1e-3);
}

// The embedding's gradient accumulated into a held gradient (Backend::embed_backward_acc) equals embed_backward into a
// zeroed fp32 buffer followed by grad_add, bit for bit, in bf16 and fp32, with its sum of squares.
TEST(EmbeddingBackward, AccumulatedIntoAHeldGradientIsBackwardThenAdd) {
  REQUIRE_GPU();
  ModelConfig c = small_config("qwen2");
  const int64_t T = 300, H = c.hidden, n = c.vocab * H;
  std::mt19937 rng(41);
  std::vector<int32_t> ids(sz(T));
  for (auto& id : ids) id = int32_t(rng() % 40);  // repeats
  auto dx = round_bf16(randn(sz(T * H), rng));
  auto held = round_bf16(randn(sz(n), rng, 0.1f));
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(3) << 30;
  CudaBackend be(c, o);
  Dev d{be};
  auto* dids = static_cast<const int32_t*>(d.put(ids));
  void* ddx = d.put_bf16(dx);
  for (DType dt : {DType::BF16, DType::F32}) {
    std::vector<float> start(held);
    void* a = dt == DType::BF16 ? d.put_bf16(start) : d.put(start);
    void* b = dt == DType::BF16 ? d.put_bf16(start) : d.put(start);
    void* demb = d.zeros(n * 4);
    void* sums = d.zeros(16);
    be.embed_backward(dids, T, ddx, demb, {});
    be.grad_add(a, dt, demb, n, static_cast<double*>(sums), {});
    be.embed_backward_acc(dids, T, ddx, b, dt, static_cast<double*>(sums) + 1, {});
    be.synchronize();
    const size_t bytes = sz(n) * dtype_size(dt);
    EXPECT_EQ(down<uint8_t>(a, bytes), down<uint8_t>(b, bytes)) << dtype_name(dt);
    const auto s = down<double>(sums, 2);
    EXPECT_EQ(s[0], s[1]) << dtype_name(dt);
  }
}

}  // namespace
