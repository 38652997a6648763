// One full training step (embedding, every layer, head + loss, backward through everything) on the
// CUDA backend in bf16, against the HF transformers fixtures (tests/fixtures/hf, fp32 on the CPU):
// loss relative error <= 1e-2 and every parameter gradient's cosine >= 0.99.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "backend/cpu/reference.h"
#include "backend/cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "io/safetensors.h"
#include "../common/hf_fixture.h"

using namespace lt;
using namespace lt::gputest;

namespace {

using lt::testing::read_f32;
using lt::testing::read_ids;
const std::filesystem::path& kFixtures = lt::testing::kHfFixtures;

void run_step(const std::string& name) {
  REQUIRE_GPU();
  const auto dir = kFixtures / name;
  ASSERT_TRUE(lt::testing::hf_fixture_present(dir));
  const ModelConfig c = load_model_config(dir);
  const ModelLayout layout = model_layout(c);
  SafetensorsFile model(dir / "model.safetensors"), fx(dir / "fixture.safetensors");
  const size_t nu = layout.units.size();
  std::vector<std::vector<float>> w(nu);
  for (size_t u = 0; u < nu; ++u) {
    w[u].assign(sz(layout.units[u].numel), 0.f);
    for (auto& p : layout.units[u].params) model.read_f32(*model.find(p.name), w[u].data() + p.offset);
  }
  const auto ids = read_ids(fx, "input_ids"), labels = read_ids(fx, "labels");
  const StTensor* idt = fx.find("input_ids");
  cpu::SeqGeometry geo{idt->shape[0], idt->shape[1], nullptr, nullptr};
  const int64_t T = geo.tokens(), H = c.hidden;
  std::vector<int32_t> targets(sz(T));
  cpu::shift_labels(labels.data(), geo, targets.data());
  int64_t n_valid = 0;
  for (int32_t t : targets) n_valid += t != cpu::kIgnoreIndex;

  CudaBackendOptions o;
  // 2 GiB holds the short fixtures; a long row's layer workspace grows with its tokens (16,384 rows ask ~2 GiB).
  o.gpu_mem_cap = std::max(int64_t(2) << 30, T * (int64_t(256) << 10));
  CudaBackend be(c, o);
  std::vector<Allocation> keep;
  auto dev = [&](int64_t bytes) {
    keep.push_back(be.alloc(MemKind::Device, bytes, "test"));
    be.fill_zero(Lane::Compute, keep.back().ptr, bytes, {});
    return keep.back().ptr;
  };
  std::vector<void*> wd(nu), gd(nu);
  for (size_t u = 0; u < nu; ++u) {
    std::vector<uint16_t> h(w[u].size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(w[u][i]);
    wd[u] = dev(int64_t(h.size()) * 2);
    cudaMemcpy(wd[u], h.data(), h.size() * 2, cudaMemcpyHostToDevice);
    gd[u] = dev(int64_t(h.size()) * 4);
  }
  be.synchronize();
  auto* d_ids = static_cast<int32_t*>(dev(T * 4));
  auto* d_tg = static_cast<int32_t*>(dev(T * 4));
  cudaMemcpy(d_ids, ids.data(), sz(T) * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_tg, targets.data(), sz(T) * 4, cudaMemcpyHostToDevice);
  std::vector<void*> xs(sz(c.layers + 1));
  for (auto& x : xs) x = dev(T * H * 2);
  void* dxa = dev(T * H * 2);
  void* dxb = dev(T * H * 2);
  auto* acc = static_cast<double*>(dev(16));
  DevGeometry g{geo.batch, geo.seq, nullptr, nullptr};

  const size_t head = nu - 1;
  const void* lm_w = c.tied ? wd[0] : static_cast<const uint16_t*>(wd[head]) + layout.head().find("lm_head.weight").offset;
  void* d_lm = c.tied ? gd[0] : static_cast<float*>(gd[head]) + layout.head().find("lm_head.weight").offset;
  be.embed_forward(wd[0], d_ids, T, xs[0], {});
  for (int64_t l = 0; l < c.layers; ++l) be.layer_forward(l, wd[sz(l + 1)], g, xs[sz(l)], xs[sz(l + 1)], {});
  be.head_loss(wd[head], lm_w, d_tg, g, xs[sz(c.layers)], 1.f / float(n_valid), dxa, gd[head], d_lm, acc, {});
  for (int64_t l = c.layers - 1; l >= 0; --l) {
    be.layer_backward(l, wd[sz(l + 1)], g, xs[sz(l)], dxa, dxb, gd[sz(l + 1)], {});
    std::swap(dxa, dxb);
  }
  be.embed_backward(d_ids, T, dxa, gd[0], {});
  be.synchronize();

  const auto a = down<double>(acc, 2);
  EXPECT_EQ(int64_t(a[1]), n_valid);
  std::vector<float> hf_loss(1);
  fx.read_f32(*fx.find("loss"), hf_loss.data());
  const double loss = a[0] / a[1];
  EXPECT_LE(std::fabs(loss - hf_loss[0]) / std::fabs(hf_loss[0]), 1e-2) << name << " loss " << loss << " HF " << hf_loss[0];
  double worst = 1;
  std::string worst_name;
  for (size_t u = 0; u < nu; ++u) {
    const auto gh = down<float>(gd[u], w[u].size());
    for (auto& p : layout.units[u].params) {
      std::vector<float> ref(sz(p.numel));
      fx.read_f32(*fx.find("grad." + p.name), ref.data());
      const double cs = cosine(gh.data() + p.offset, ref.data(), sz(p.numel));
      EXPECT_GE(cs, 0.99) << name << ": " << p.name;
      if (cs < worst) worst = cs, worst_name = p.name;
    }
  }
  std::printf("[hf-step bf16] %s: loss %.6f (HF %.6f, rel %.2e); min gradient cosine %.5f (%s)\n", name.c_str(), loss,
              hf_loss[0], std::fabs(loss - hf_loss[0]) / hf_loss[0], worst, worst_name.c_str());
  for (auto& k : keep) be.free(k);
}

TEST(HfStepBf16, Qwen2BiasTied) { run_step("qwen2_bias_tied"); }
TEST(HfStepBf16, Qwen3QkNormUntied) { run_step("qwen3_qknorm_untied"); }
TEST(HfStepBf16, Llama3RopeScalingUntied) { run_step("llama3_rope_untied"); }
TEST(HfStepBf16, Llama32MqaTied) { run_step("llama32_mqa_tied"); }
TEST(HfStepBf16, Qwen2LongRow16k) { run_step("qwen2_long_row"); }  // one row of 16,384 tokens
// Qwen3.5 hybrids (tools/make_hf_fixtures_qwen35.py: Gated DeltaNet + gated attention layers, (1 + w)
// norms, partial RoPE; 2 x 80 tokens). The qwen35_bf16_* fixtures carry the features of qwen35_tied_3to1
// and qwen35_untied_odd at hidden 256 with bf16-representable weights. Those two (hidden 64 and 48) are
// not run here: bf16 activation rounding alone moves their gradients to cosine 0.979 / 0.924 even with
// bf16 weights (docs/notes.md 0b); they stay for the exact fp32 CPU parity (HfParity.*).
TEST(HybridHfStepBf16, Qwen35Bf16Tied3to1) { run_step("qwen35_bf16_tied_3to1"); }
TEST(HybridHfStepBf16, Qwen35Bf16OddHeads) { run_step("qwen35_bf16_odd_heads"); }
TEST(HybridHfStepBf16, Qwen35HeadDim128Conv3) { run_step("qwen35_hd128"); }

}  // namespace
