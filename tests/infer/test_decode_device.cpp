// CPU-side logic of GPU decoding: option parsing, the device choice (auto / cpu / cuda with and without
// a CUDA build or a visible GPU), the decoder's memory plan and the resident-vs-streamed choice, and
// the CPU Generator wrapper (same tokens as greedy_generate, counted statistics).
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/units.h"
#include "infer/decode_device.h"
#include "infer/decode_plan.h"
#include "infer/decode_state.h"
#include "infer/generate.h"
#include "model/init.h"

using namespace lt;
using namespace lt::train;

namespace {

ModelWeightsView view(const ModelWeights& m) { return view_of(m); }

struct FakeGpuGenerator final : Generator {
  std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& p, const GenerateOptions&) override {
    return std::vector<std::vector<int32_t>>(p.size());
  }
  std::string describe() const override { return "fake gpu"; }
  DecodeStats stats() const override { return {}; }
};

GpuDecodeHooks fake_hooks(bool visible, DecodeDeviceOptions* seen = nullptr, Backend** seen_borrow = nullptr) {
  GpuDecodeHooks h;
  h.gpu_visible = [visible] { return visible; };
  h.make = [seen, seen_borrow](const ModelWeightsView&, const DecodeDeviceOptions& o, Backend* b) -> std::unique_ptr<Generator> {
    if (seen) *seen = o;
    if (seen_borrow) *seen_borrow = b;
    return std::make_unique<FakeGpuGenerator>();
  };
  return h;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(DecodeOptions, ParseDeviceAndWeights) {
  EXPECT_EQ(parse_decode_device("auto"), DecodeDevice::Auto);
  EXPECT_EQ(parse_decode_device("cpu"), DecodeDevice::Cpu);
  EXPECT_EQ(parse_decode_device("cuda"), DecodeDevice::Cuda);
  EXPECT_NE(error_of([] { parse_decode_device("tpu"); }).find("expected auto, cpu or cuda"), std::string::npos);
  EXPECT_EQ(parse_weights_mode("auto"), WeightsMode::Auto);
  EXPECT_EQ(parse_weights_mode("resident"), WeightsMode::Resident);
  EXPECT_EQ(parse_weights_mode("streamed"), WeightsMode::Streamed);
  EXPECT_NE(error_of([] { parse_weights_mode("paged"); }).find("auto, resident or streamed"), std::string::npos);
  EXPECT_STREQ(weights_mode_name(WeightsMode::Streamed), "streamed");
  EXPECT_STREQ(decode_device_name(DecodeDevice::Cuda), "cuda");
}

TEST(DecodeDevice, AutoPicksTheGpuOnlyWhenBuiltAndVisible) {
  EXPECT_EQ(resolve_decode_device(DecodeDevice::Auto, GpuDecodeHooks{}), DecodeDevice::Cpu);  // no CUDA build
  EXPECT_EQ(resolve_decode_device(DecodeDevice::Auto, fake_hooks(false)), DecodeDevice::Cpu);
  EXPECT_EQ(resolve_decode_device(DecodeDevice::Auto, fake_hooks(true)), DecodeDevice::Cuda);
  EXPECT_EQ(resolve_decode_device(DecodeDevice::Cpu, fake_hooks(true)), DecodeDevice::Cpu);
  EXPECT_EQ(resolve_decode_device(DecodeDevice::Cuda, fake_hooks(true)), DecodeDevice::Cuda);
}

TEST(DecodeDevice, CudaWithoutBuildOrGpuSaysSo) {
  const std::string no_build = error_of([] { resolve_decode_device(DecodeDevice::Cuda, GpuDecodeHooks{}); });
  EXPECT_NE(no_build.find("built without the CUDA backend"), std::string::npos) << no_build;
  const std::string no_gpu = error_of([] { resolve_decode_device(DecodeDevice::Cuda, fake_hooks(false)); });
  EXPECT_NE(no_gpu.find("no CUDA device is visible"), std::string::npos) << no_gpu;
}

TEST(DecodeDevice, MakeGeneratorRoutesOptionsAndBorrow) {
  ModelWeights m = random_model(preset_config("tiny-qwen2"), 3);
  DecodeDeviceOptions o;
  o.weights = WeightsMode::Streamed;
  o.gpu_mem_gib = 12;
  o.max_batch = 7;
  o.max_seq = 99;
  DecodeDeviceOptions seen;
  Backend* borrow = reinterpret_cast<Backend*>(0x1234);
  Backend* seen_borrow = nullptr;
  auto g = make_generator(view(m), o, fake_hooks(true, &seen, &seen_borrow), borrow);
  EXPECT_EQ(g->describe(), "fake gpu");
  EXPECT_EQ(seen.weights, WeightsMode::Streamed);
  EXPECT_EQ(seen.gpu_mem_gib, 12);
  EXPECT_EQ(seen.max_batch, 7);
  EXPECT_EQ(seen.max_seq, 99);
  EXPECT_EQ(seen_borrow, borrow);
  o.device = DecodeDevice::Cpu;  // GPU-only options are ignored (with a warning) on the CPU
  EXPECT_EQ(make_generator(view(m), o, fake_hooks(true))->describe(), "CPU (fp32, KV cache)");
  o.gpu_mem_gib = -1;
  EXPECT_NE(error_of([&] { make_generator(view(m), o, fake_hooks(true)); }).find("--gpu-mem"), std::string::npos);
}

// A model the GPU decoder does not support (a hook refusing hybrids stands in for one): auto falls back to
// the CPU, cuda says why.
TEST(DecodeDevice, UnsupportedModelDecodesOnTheCpuUnderAutoAndFailsUnderCuda) {
  ModelWeights m = random_model(preset_config("tiny-qwen35"), 3);
  GpuDecodeHooks h = fake_hooks(true);
  h.unsupported = [](const ModelConfig& c) { return c.hybrid() ? std::string("hybrid models decode on the CPU") : ""; };
  DecodeDeviceOptions o;
  EXPECT_EQ(make_generator(view(m), o, h)->describe(), "CPU (fp32, KV cache)");
  o.device = DecodeDevice::Cuda;
  EXPECT_NE(error_of([&] { make_generator(view(m), o, h); }).find("hybrid models decode on the CPU"), std::string::npos);
  ModelWeights q2 = random_model(preset_config("tiny-qwen2"), 3);
  EXPECT_EQ(make_generator(view(q2), o, h)->describe(), "fake gpu");
}

TEST(DecodeDevice, CpuGeneratorEqualsGreedyGenerateAndCounts) {
  ModelConfig c = preset_config("tiny-qwen3");
  ModelWeights m = random_model(c, 8);
  std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {9}, {4, 4, 4, 4, 4}};
  GenerateOptions opt;
  opt.max_new_tokens = 5;
  opt.batch_size = 2;
  auto ref = greedy_generate(view(m), prompts, opt);
  auto g = make_cpu_generator(view(m));
  EXPECT_EQ(g->generate(prompts, opt), ref);
  DecodeStats s = g->stats();
  EXPECT_EQ(s.sequences, 3);
  EXPECT_EQ(s.prompt_tokens, 9);
  EXPECT_EQ(s.generated_tokens, 15);
  EXPECT_GE(s.seconds(), 0.0);
  const std::string line = format_decode_stats(g->describe(), s);
  EXPECT_NE(line.find("decode on CPU"), std::string::npos) << line;
  EXPECT_NE(line.find("15 tokens generated"), std::string::npos) << line;
}

TEST(DecodePlan, CapacityAndWorkspaceLayout) {
  DecodeCapacity a = decode_capacity(4, 100);
  EXPECT_EQ(a.prefill_rows, 400);
  DecodeCapacity b = decode_capacity(128, 256);
  EXPECT_EQ(b.prefill_rows, kDecodePrefillRows);
  DecodeCapacity long_seq = decode_capacity(2, 20000);
  EXPECT_EQ(long_seq.prefill_rows, 20000);  // a whole prompt always fits one pass
  EXPECT_THROW(decode_capacity(0, 5), Error);

  ModelConfig c = preset_config("qwen2.5-0.5b");
  DecodeWorkspace w = decode_workspace(c, b);
  // Tables first (one staging copy), every piece 256-byte aligned and inside the workspace.
  EXPECT_EQ(w.ids, 0);
  EXPECT_LE(w.last_rows, w.table_bytes);
  for (int64_t off : {w.x, w.x1, w.h, w.gu, w.act, w.mixer, w.hn, w.xr, w.logits, w.partial, w.ids, w.pos, w.seg,
                      w.len, w.slot, w.out_ids, w.dst_row, w.row0, w.last_rows, w.inv_freq, w.err, w.gemm}) {
    EXPECT_EQ(off % 256, 0);
    EXPECT_LT(off, w.bytes);
  }
  EXPECT_GE(w.bytes - w.logits, 128 * c.vocab * 4);  // the logits of a whole batch
  EXPECT_LE(w.slot, w.table_bytes);
  EXPECT_EQ(w.mixer_bytes, attn_decode_scratch(c, b.prefill_rows).bytes);  // one kind: its scratch
}

// Hybrid models: attention layers keep a KV cache, Gated DeltaNet layers conv windows and fp32 recurrent
// states per sequence slot; the mixers' scratch is the larger kind's.
TEST(DecodePlan, HybridStatesPerLayerKind) {
  ModelConfig c = preset_config("tiny-qwen35");
  ASSERT_TRUE(c.hybrid());
  ModelLayout lay = model_layout(c);
  DecodeCapacity cap = decode_capacity(8, 100);
  DecodeMemory m = decode_memory(c, lay, cap);
  const auto& l = c.linear;
  const int64_t kv = 2 * ((8 * 100 * c.kv_dim() * 2 + 255) / 256 * 256);
  const int64_t conv = (8 * l.conv_dim() * (l.conv_kernel - 1) * 4 + 255) / 256 * 256;
  const int64_t rec = (8 * l.v_heads * l.k_head_dim * l.v_head_dim * 4 + 255) / 256 * 256;
  EXPECT_EQ(m.kv_cache, c.count(LayerKind::Attention) * kv + c.count(LayerKind::GatedDeltaNet) * (conv + rec));
  EXPECT_EQ(decode_state_bytes(c, LayerKind::GatedDeltaNet, cap), conv + rec);
  DecodeWorkspace w = decode_workspace(c, cap);
  const int64_t R = cap.prefill_rows;
  EXPECT_EQ(w.mixer_bytes, std::max(attn_decode_scratch(c, R).bytes, gdn_decode_scratch(c, R).bytes));
  const GdnDecodeScratch g = gdn_decode_scratch(c, R);
  EXPECT_GE(g.bytes - g.chunk_states, (R + 63) / 64 * l.v_heads * l.k_head_dim * l.v_head_dim * 4);
  const AttnDecodeScratch a = attn_decode_scratch(c, R);
  EXPECT_GE(a.qfull, 0);  // Qwen3.5's gated attention
  EXPECT_GE(a.bytes - a.qfull, R * 2 * c.q_dim() * 2);
}

TEST(DecodePlan, MemoryOfQwen05B) {
  ModelConfig c = preset_config("qwen2.5-0.5b");
  ModelLayout lay = model_layout(c);
  DecodeCapacity cap = decode_capacity(32, 256);
  DecodeMemory m = decode_memory(c, lay, cap);
  // bf16 weights: 2 bytes per element of each unit (the embedding doubles as the tied LM head).
  EXPECT_EQ(m.embedding, (c.vocab * c.hidden * 2 + 255) / 256 * 256);
  int64_t layers = 0;
  for (int64_t l = 0; l < c.layers; ++l) layers += decode_unit_bytes(lay.layer(l));
  EXPECT_EQ(m.layers, layers);
  EXPECT_EQ(m.layer_max * c.layers, m.layers);  // all layers alike
  // K and V: layers x (32 x 256) rows x kv_dim bf16 each.
  EXPECT_EQ(m.kv_cache, 2 * c.layers * 32 * 256 * c.kv_dim() * 2);
  EXPECT_EQ(m.resident() - m.streamed(), m.layers - 2 * m.layer_max);
  const double gib = double(m.resident()) / double(GiB);
  EXPECT_GT(gib, 0.9);  // ~0.99 GB of bf16 weights + cache + workspace
  EXPECT_LT(gib, 1.6);
}

TEST(DecodePlan, ChoosesResidentWhenItFitsElseStreamed) {
  DecodeMemory m;
  m.embedding = 100, m.head = 10, m.layers = 1000, m.layer_max = 100, m.kv_cache = 50, m.workspace = 40;
  ASSERT_EQ(m.resident(), 1200);
  ASSERT_EQ(m.streamed(), 400);
  WeightsChoice w = choose_weights_mode(m, 1200, WeightsMode::Auto);
  EXPECT_EQ(w.mode, WeightsMode::Resident);
  EXPECT_EQ(w.device_bytes, 1200);
  w = choose_weights_mode(m, 1199, WeightsMode::Auto);
  EXPECT_EQ(w.mode, WeightsMode::Streamed);
  EXPECT_EQ(w.device_bytes, 400);
  w = choose_weights_mode(m, 5000, WeightsMode::Streamed);  // forced even when resident fits
  EXPECT_EQ(w.mode, WeightsMode::Streamed);
  const std::string forced = error_of([&] { choose_weights_mode(m, 1000, WeightsMode::Resident); });
  EXPECT_NE(forced.find("does not fit: device short by"), std::string::npos) << forced;
  EXPECT_NE(forced.find("--weights streamed"), std::string::npos) << forced;
  const std::string none = error_of([&] { choose_weights_mode(m, 399, WeightsMode::Auto); });
  EXPECT_NE(none.find("even with streamed weights"), std::string::npos) << none;
  EXPECT_NE(none.find("--batch-size"), std::string::npos) << none;
}
