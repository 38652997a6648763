#include <gtest/gtest.h>

#include "core/error.h"
#include "model/accounting.h"
#include "model/model_config.h"

using namespace lt;

// Values below are worked out by hand from the shapes (see docs/model.md "Accounting").
TEST(Accounting, TinyQwen2ByHand) {
  auto c = preset_config("tiny-qwen2");  // H 64, heads 4/2, head_dim 16, F 128, bias
  auto r = layer_cost(c, 2, 8, 2);
  EXPECT_EQ(r.params, 128 + (4096 + 64) + 2 * (2048 + 32) + 4096 + 3 * 64 * 128);
  const double T = 16;
  const double matmul = 4096 + 2048 + 2048 + 4096 + 3 * 64 * 128;
  EXPECT_DOUBLE_EQ(r.flops_fwd, 2 * T * matmul + 2.0 * 2 * 8 * 8 * 64);
  EXPECT_DOUBLE_EQ(r.flops_bwd, 2 * r.flops_fwd);
  EXPECT_EQ(r.boundary_bytes, 16 * 64 * 2);
  // xn, q, k, v, attn, h, hn, gate, up, act (bf16) + 2 rstd + 4 lse (fp32)
  EXPECT_EQ(r.internal_bytes, 16 * ((64 + 64 + 32 + 32 + 64 + 64 + 64 + 3 * 128) * 2 + (2 + 4) * 4));
  // max(fwd T(H+3F), bwd mlp T(3F+2H), bwd attn T(2Q+2KV+2H)*2 + 4TQ)
  EXPECT_EQ(r.workspace_bytes, std::max<int64_t>({16 * (64 + 384) * 2, 16 * (384 + 128) * 2,
                                                  16 * (128 + 64 + 128) * 2 + 16 * 64 * 4}));
  auto r4 = layer_cost(c, 2, 8, 4);
  EXPECT_EQ(r4.boundary_bytes, 2 * r.boundary_bytes);
}

TEST(Accounting, Qwen3CountsQkNormInternals) {
  auto c = preset_config("tiny-qwen3");  // H 64, heads 4/2, head_dim 32 -> Q 128, KV 64, F 128
  auto r = layer_cost(c, 1, 4, 2);
  const int64_t act = 64 + 128 + 2 * 64 + 128 + 64 + 64 + 3 * 128 + (128 + 64);
  const int64_t f32 = 2 + 4 + 4 + 2;
  EXPECT_EQ(r.internal_bytes, 4 * (act * 2 + f32 * 4));
  EXPECT_EQ(r.params, 128 + 128 * 64 + 2 * 64 * 64 + 64 * 128 + 2 * 32 + 3 * 64 * 128);
}

TEST(Accounting, ScalesWithShape) {
  auto c = preset_config("qwen2.5-7b");
  auto a = layer_cost(c, 1, 1024);
  auto b = layer_cost(c, 2, 1024);
  auto s = layer_cost(c, 1, 2048);
  EXPECT_DOUBLE_EQ(b.flops_fwd, 2 * a.flops_fwd);     // linear in batch
  EXPECT_GT(s.flops_fwd, 2 * a.flops_fwd);            // attention is quadratic in seq
  EXPECT_EQ(b.boundary_bytes, 2 * a.boundary_bytes);
  EXPECT_EQ(b.internal_bytes, 2 * a.internal_bytes);
  // Layer params times layers plus embedding/head equals the model count.
  EXPECT_EQ(a.params * c.layers + 2 * c.vocab * c.hidden + c.hidden, parameter_count(c));
  // 6*N*tokens convention
  EXPECT_DOUBLE_EQ(model_flops_per_step(c, 1024), 6.0 * 7615616512.0 * 1024);
  EXPECT_DOUBLE_EQ(head_flops_fwd(c, 10), 2.0 * 10 * 3584 * 152064);
  EXPECT_EQ(head_chunk_workspace_bytes(c, 128), 128 * 152064 * (4 + 2));
  EXPECT_THROW(layer_cost(c, 0, 1024), lt::Error);
  EXPECT_THROW(layer_cost(c, 1, 1024, 3), lt::Error);
}

// The MLP's passes (mlp_pass_rows): all rows up to ~1 GiB of its F-wide buffers, equal passes above, so that at 256k
// tokens the Qwen2.5-7B layer's workspace holds one pass of gate/up/act, not 256k rows of them.
TEST(Accounting, MlpPassesBoundTheFfnWideBuffers) {
  auto c = preset_config("qwen2.5-7b");  // F 18944: 113,664 B a row
  EXPECT_EQ(mlp_pass_bound(c), 9216);
  EXPECT_EQ(mlp_pass_rows(c, 4096), 4096);
  EXPECT_EQ(mlp_pass_rows(c, 9216), 9216);
  EXPECT_EQ(mlp_pass_rows(c, 9217), 4609);      // two equal passes
  EXPECT_EQ(mlp_pass_rows(c, 262144), 9040);    // 29 passes
  EXPECT_EQ(mlp_pass_rows(c, 200, 64), 50);     // a bound of 64: four passes
  EXPECT_EQ(mlp_pass_rows(c, 0), 1);
  EXPECT_EQ(mlp_pass_bound(preset_config("tiny-qwen2")), (int64_t(1) << 30) / (6 * 128) / 256 * 256);
  const auto small = layer_cost(c, 1, 4096), at_len = layer_cost(c, 1, 262144);
  const int64_t H = c.hidden, F = c.ffn;
  EXPECT_GE(small.workspace_bytes, 4096 * (3 * F + 2 * H) * 2);  // below the bound: every row in one pass
  // At 256k tokens the F-wide part is one pass of 9,040 rows: the attention's backward (T x (2Q + 2KV + 2H) bf16 and
  // an fp32 dq) sets the workspace, 11.8 GB, not the MLP's 31.7 GB of T x (H + 3F).
  EXPECT_LT(double(at_len.workspace_bytes), 262144.0 * double(H + 3 * F) * 2 / 2);
  EXPECT_GE(at_len.workspace_bytes, (262144 * H + 9040 * 3 * F) * 2);
}

// Attention-inclusive model FLOPs (docs/metrics.md "TFLOPS with attention"), by hand.
TEST(Accounting, AttentionFlopsTinyQwen2ByHand) {
  auto c = preset_config("tiny-qwen2");  // 2 layers, all full attention; q_dim 4 * 16 = 64
  // 2 rows of 8 tokens, each one segment: sum len^2 = 2 * 64 = 128.
  const StepRows full = full_rows(2, 8);
  EXPECT_EQ(full.tokens, 16);
  EXPECT_DOUBLE_EQ(full.sum_sq_len, 128);
  // Per layer: QK^T + PV forward at half the square, 2 * 64 * 128; fwd + bwd 3x; 2 layers.
  EXPECT_DOUBLE_EQ(sequence_mixer_flops(c, full), 2 * 3 * 2.0 * 64 * 128);
  EXPECT_DOUBLE_EQ(model_flops_with_attention(c, full), model_flops_per_step(c, 16) + 98304.0);
  // The layer accounting's attention core at full rows is the same forward count.
  EXPECT_DOUBLE_EQ(sequence_mixer_flops(c, full), 3.0 * 2 * layer_cost(c, 2, 8).flops_core_fwd);
  // A packed row of samples of 3 and 5 tokens: sum len^2 = 9 + 25 = 34.
  const int32_t seg[8] = {0, 0, 0, 1, 1, 1, 1, 1};
  StepRows packed;
  add_row(packed, seg, 8);
  EXPECT_EQ(packed.tokens, 8);
  EXPECT_DOUBLE_EQ(packed.sum_sq_len, 34);
  EXPECT_DOUBLE_EQ(sequence_mixer_flops(c, packed), 2 * 3 * 2.0 * 64 * 34);
  StepRows one;
  add_row(one, nullptr, 8);  // no ids: one segment
  EXPECT_DOUBLE_EQ(one.sum_sq_len, 64);
}

TEST(Accounting, AttentionFlopsHybridByHand) {
  auto c = preset_config("tiny-qwen35");  // 3 DeltaNet + 1 attention; q_dim 4 * 32 = 128
  // DeltaNet: 4 value heads, Dk 16, Dv 24, chunk 64: per token and head 64 (3*16 + 2*24) + 6*16*24 = 8448.
  const StepRows rows = full_rows(2, 8);  // 16 tokens, sum len^2 128
  const double attn = 1 * 3 * 2.0 * 128 * 128;
  const double gdn = 3 * 3 * 16.0 * 4 * 8448;
  EXPECT_DOUBLE_EQ(sequence_mixer_flops(c, rows), attn + gdn);
  EXPECT_DOUBLE_EQ(model_flops_with_attention(c, rows), model_flops_per_step(c, 16) + attn + gdn);
  EXPECT_THROW(sequence_mixer_flops(c, StepRows{-1, 0}), lt::Error);
}
