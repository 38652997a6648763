// Qwen3.5/3.6 hybrid models on the CUDA backend: one decoder layer of each kind (Gated DeltaNet, gated
// full attention with (1 + w) norms and partial RoPE) through the CudaBackend against the fp32 CPU
// reference (src/backend/cpu/reference.h) on the same bf16-rounded weights and inputs, with the
// tolerances of test_layer.cpp's LayerTest; the head's (1 + w) final norm; which shapes GPU decoding refuses.
// Whole-model HF parity: test_hf_step.cpp (HybridHfStepBf16); plan invariance: test_plan_invariance.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/reference.h"
#include "backend/cuda/cuda_backend.h"
#include "infer/cuda/cuda_decoder.h"
#include "core/error.h"
#include "gpu_test_util.h"
#include "hybrid_test_util.h"

using namespace lt;
using namespace lt::gputest;

namespace {

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

double l2(const float* a, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * a[i];
  return std::sqrt(s);
}

struct HybridCase {
  std::string cfg;
  int64_t layer;  // 0: Gated DeltaNet, 1: gated attention
  int64_t batch, seq;
  bool packed;  // segments + explicit positions
};
class HybridLayer : public ::testing::TestWithParam<HybridCase> {};

TEST_P(HybridLayer, ForwardBackwardMatchCpuReference) {
  REQUIRE_GPU();
  const HybridCase hc = GetParam();
  const ModelConfig c = hybrid_config(hc.cfg);
  const ModelLayout layout = model_layout(c);
  const UnitLayout& lay = layout.layer(hc.layer);
  if (hc.cfg == "hd64_h72") {  // the case exists for the padded (non-adjacent) input projections
    const ParamInfo& b = lay.find("linear_attn.in_proj_b.weight");
    ASSERT_NE(b.offset + b.numel, lay.find("linear_attn.in_proj_a.weight").offset);
  }
  const int64_t T = hc.batch * hc.seq, H = c.hidden;
  std::mt19937 rng(uint32_t(23 + hc.layer));
  auto w = unit_weights(lay, rng);
  auto x = round_bf16(randn(sz(T * H), rng)), dy = round_bf16(randn(sz(T * H), rng, 0.1f));
  std::vector<int32_t> seg(sz(T)), pos(sz(T));
  for (int64_t b = 0; b < hc.batch; ++b)
    for (int64_t s = 0; s < hc.seq; ++s) {
      const int32_t sg = int32_t(s < hc.seq / 3 ? 0 : (s < hc.seq * 3 / 4 ? 1 : 2));
      seg[sz(b * hc.seq + s)] = sg;
      const int64_t start = sg == 0 ? 0 : (sg == 1 ? hc.seq / 3 : hc.seq * 3 / 4);
      pos[sz(b * hc.seq + s)] = int32_t(s - start);
    }
  cpu::SeqGeometry g{hc.batch, hc.seq, hc.packed ? pos.data() : nullptr, hc.packed ? seg.data() : nullptr};
  std::vector<float> y_ref(sz(T * H)), dx_ref(sz(T * H)), dw_ref(sz(lay.numel), 0.f);
  cpu::layer_forward(c, lay, w.data(), g, x.data(), y_ref.data());
  cpu::layer_backward(c, lay, w.data(), g, x.data(), dy.data(), dx_ref.data(), dw_ref.data());

  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(4) << 30;
  CudaBackend be(c, o);
  Dev d{be, {}};
  void* dw_ = d.put_bf16(w);
  void* dx_ = d.put_bf16(x);
  void* ddy = d.put_bf16(dy);
  void* y = d.zeros(T * H * 2);
  void* gx = d.zeros(T * H * 2);
  void* gw = d.zeros(lay.numel * 4);
  DevGeometry dg{hc.batch, hc.seq, hc.packed ? static_cast<const int32_t*>(d.put(pos)) : nullptr,
                 hc.packed ? static_cast<const int32_t*>(d.put(seg)) : nullptr};
  be.layer_forward(hc.layer, dw_, dg, dx_, y, {});
  be.layer_backward(hc.layer, dw_, dg, dx_, ddy, gx, gw, {});
  be.synchronize();
  const double ey = rel_err(down_bf16(y, sz(T * H)), y_ref), ex = rel_err(down_bf16(gx, sz(T * H)), dx_ref);
  EXPECT_LE(ey, 1e-2);
  EXPECT_LE(ex, 3e-2);
  auto gwh = down<float>(gw, sz(lay.numel));
  double max_norm = 0, worst_cos = 1;
  for (auto& p : lay.params) max_norm = std::max(max_norm, l2(dw_ref.data() + p.offset, p.numel));
  for (auto& p : lay.params) {
    if (l2(dw_ref.data() + p.offset, p.numel) < 1e-4 * max_norm) {
      // Mathematically zero (q/k path of a single-token sequence): only rounding noise may remain.
      EXPECT_LE(l2(gwh.data() + p.offset, p.numel), 1e-3 * max_norm) << p.suffix;
      continue;
    }
    const double cs = cosine(gwh.data() + p.offset, dw_ref.data() + p.offset, sz(p.numel));
    std::vector<float> a(gwh.begin() + p.offset, gwh.begin() + p.offset + p.numel);
    std::vector<float> r(dw_ref.begin() + p.offset, dw_ref.begin() + p.offset + p.numel);
    EXPECT_GE(cs, 0.995) << p.suffix;
    EXPECT_LE(rel_err(a, r), 5e-2) << p.suffix;
    worst_cos = std::min(worst_cos, cs);
  }
  std::printf("[hybrid-layer] %s %s B%lld S%lld%s: y rel %.2e, dx rel %.2e, worst dW cosine %.5f\n", hc.cfg.c_str(),
              layer_kind_short_name(c.kind(hc.layer)), (long long)hc.batch, (long long)hc.seq,
              hc.packed ? " packed" : "", ey, ex, worst_cos);
  // Accumulation: a second backward doubles dw.
  be.layer_backward(hc.layer, dw_, dg, dx_, ddy, gx, gw, {});
  be.synchronize();
  auto gw2 = down<float>(gw, sz(lay.numel));
  std::vector<float> twice(gwh.size());
  for (size_t i = 0; i < twice.size(); ++i) twice[i] = 2 * gwh[i];
  EXPECT_LE(rel_err(gw2, twice), 1e-3);
}

std::vector<HybridCase> hybrid_cases() {
  std::vector<HybridCase> v;
  for (int64_t layer : {0, 1}) {
    v.push_back({"hd64", layer, 2, 100, false});   // seq not a multiple of 64
    v.push_back({"hd64", layer, 3, 64, true});     // packed segments, one chunk
    v.push_back({"hd64", layer, 1, 1, false});     // a single token
    v.push_back({"hd128", layer, 1, 130, true});   // packed, three chunks, GQA 3 linear heads
    v.push_back({"hd256", layer, 2, 70, false});   // the 27B head_dim (generic attention)
    v.push_back({"hd256", layer, 1, 129, true});
  }
  v.push_back({"hd64_h72", 0, 2, 70, true});  // the input projections as four GEMMs (not adjacent in the layout)
  for (int64_t layer : {0, 1}) v.push_back({"hd128", layer, 1, 16384, true});  // a long packed row: 256 chunks
  return v;
}

INSTANTIATE_TEST_SUITE_P(Qwen35, HybridLayer, ::testing::ValuesIn(hybrid_cases()), [](const auto& info) {
  const HybridCase& p = info.param;
  return p.cfg + (p.layer == 0 ? "_deltanet" : "_attention") + "_B" + std::to_string(p.batch) + "_S" +
         std::to_string(p.seq) + (p.packed ? "_packed" : "");
});

// The final norm scales by (1 + w) too.
TEST(HybridHead, PlusOneNormLossAndGradientsMatchCpuReference) {
  REQUIRE_GPU();
  ModelConfig c = hybrid_config("hd64");
  c.tied = false;
  const ModelLayout layout = model_layout(c);
  const UnitLayout& hl = layout.head();
  const int64_t T = 200, H = c.hidden, V = c.vocab;
  std::mt19937 rng(41);
  auto hw = unit_weights(hl, rng);
  const float* lm = hw.data() + hl.find("lm_head.weight").offset;
  std::vector<float> lmv(lm, lm + V * H);
  auto x = round_bf16(randn(sz(T * H), rng));
  std::vector<int32_t> tg(sz(T));
  for (int64_t t = 0; t < T; ++t) tg[sz(t)] = t % 7 == 0 ? -100 : int32_t(rng() % V);
  std::vector<float> dx_ref(sz(T * H)), dhw_ref(sz(hl.numel), 0.f), dlm_ref(sz(V * H), 0.f);
  const float scale = 1.f / 150;
  auto r = cpu::head_forward_backward(c, hl, hw.data(), lmv.data(), tg.data(), T, x.data(), scale, dx_ref.data(),
                                      dhw_ref.data(), dlm_ref.data());
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(3) << 30;
  CudaBackend be(c, o);
  Dev d{be, {}};
  void* dhw = d.put_bf16(hw);
  const void* dlm = static_cast<const uint16_t*>(dhw) + hl.find("lm_head.weight").offset;
  void* dxx = d.put_bf16(x);
  void* dtg = d.put(tg);
  void* gx = d.zeros(T * H * 2);
  void* ghw = d.zeros(hl.numel * 4);
  void* glm = d.zeros(V * H * 4);
  void* acc = d.zeros(16);
  be.head_loss(dhw, dlm, static_cast<const int32_t*>(dtg), DevGeometry{2, 100, nullptr, nullptr}, dxx, scale, gx, ghw,
               glm, static_cast<double*>(acc), {});
  be.synchronize();
  auto a = down<double>(acc, 2);
  EXPECT_EQ(int64_t(a[1]), r.n_tokens);
  EXPECT_NEAR(a[0], r.loss_sum, 1e-2 * std::max(1.0, std::fabs(r.loss_sum)));
  EXPECT_LE(rel_err(down_bf16(gx, sz(T * H)), dx_ref), 3e-2);
  auto g = down<float>(ghw, sz(hl.numel));
  const int64_t off = hl.find("norm.weight").offset;
  EXPECT_GE(cosine(g.data() + off, dhw_ref.data() + off, sz(H)), 0.99);
}

// The workspace covers the larger of the two kinds, for any sample split of the same tokens.
TEST(HybridBackend, WorkspaceCoversBothKinds) {
  REQUIRE_GPU();
  const ModelConfig c = hybrid_config("hd128");
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(2) << 30;
  CudaBackend be(c, o);
  EXPECT_GT(be.layer_workspace_bytes(512), 0);
  be.reserve_workspace(512);
  Dev d{be, {}};
  const ModelLayout layout = model_layout(c);
  std::mt19937 rng(5);
  for (int64_t layer : {0, 1}) {
    auto w = unit_weights(layout.layer(layer), rng);
    void* wd = d.put_bf16(w);
    void* x = d.put_bf16(round_bf16(randn(sz(512 * c.hidden), rng)));
    void* y = d.zeros(512 * c.hidden * 2);
    for (int64_t s : {512, 65, 8})  // 1 x 512, then samples that leave partial chunks
      be.layer_forward(layer, wd, DevGeometry{512 / s, s, nullptr, nullptr}, x, y, {});
    be.synchronize();
    auto out = down_bf16(y, sz((512 / 8) * 8 * c.hidden));
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return std::isfinite(v); })) << layer;
  }
}

// GPU decoding supports the hybrid shapes the Gated DeltaNet kernels run (test_hybrid_decode.cpp); a
// shape they lack is refused with a message naming it (the callers then decode on the CPU under --device
// auto; see infer/decode_device.cpp).
TEST(HybridDecode, RefusesOnlyShapesTheKernelsLack) {
  REQUIRE_GPU();
  for (const char* k : {"hd64", "hd128", "hd256"}) EXPECT_EQ(cuda::decoder_unsupported(hybrid_config(k)), "") << k;
  ModelConfig c = hybrid_config("hd64");
  c.linear.k_head_dim = 12;  // not a multiple of 8
  EXPECT_NE(cuda::decoder_unsupported(c).find("Gated DeltaNet shape"), std::string::npos);
  const ModelLayout layout = model_layout(c);
  cuda::DecoderOptions o;
  o.gpu_mem_cap = int64_t(2) << 30;
  try {
    cuda::CudaDecoder dec(c, layout, [](int64_t, uint16_t*) {}, o);
    FAIL() << "expected lt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Gated DeltaNet shape"), std::string::npos) << e.what();
  }
}

}  // namespace
