// Bytes and FLOPs per layer. Formulas and the exact list of saved tensors are in docs/model.md
// ("Accounting"); keep the two in step.
#include "model/accounting.h"

#include <algorithm>

#include "core/error.h"
#include "model/mixer.h"
#include "model/param_layout.h"
#include "model/sequence.h"

namespace lt {

namespace {

struct LayerParams {
  int64_t all = 0;
  int64_t matmul = 0;  // 2-D weights (the ones that cost 2 FLOPs per token per element)
};

LayerParams layer_params(const ModelConfig& c, int64_t layer) {
  LayerParams p;
  for (auto& pi : layer_unit_layout(c, layer).params) {
    p.all += pi.numel;
    if (pi.is_matrix) p.matmul += pi.numel;
  }
  return p;
}

int64_t first_layer_of(const ModelConfig& c, LayerKind k) {
  for (int64_t i = 0; i < c.layers; ++i)
    if (c.kind(i) == k) return i;
  fail("layer_cost: the model has no {} layer", layer_kind_short_name(k));
}

}  // namespace

LayerCost layer_cost(const ModelConfig& c, LayerKind kind, int64_t batch, int64_t seq, int act_bytes) {
  LT_CHECK(batch > 0 && seq > 0, "layer_cost: batch and seq must be positive, got {} x {}", batch, seq);
  LT_CHECK(act_bytes == 2 || act_bytes == 4, "layer_cost: act_bytes must be 2 or 4, got {}", act_bytes);
  const double T = double(batch) * double(seq);
  const int64_t Ti = batch * seq;
  const int64_t H = c.hidden, F = c.ffn;
  auto lp = layer_params(c, first_layer_of(c, kind));
  const MixerCost mx = mixer_spec(kind).cost(c, batch, seq);

  LayerCost r;
  r.params = lp.all;
  // Matmuls: 2 FLOPs per weight element per token; the mixer's core on top (mixer_*.cpp).
  r.flops_core_fwd = mx.core_flops_fwd;
  r.flops_fwd = 2.0 * T * double(lp.matmul) + mx.core_flops_fwd;
  // Backward: each matmul needs two (grad input, grad weight); the mixer core likewise.
  r.flops_bwd = 2.0 * r.flops_fwd;

  const int64_t A = act_bytes;
  r.boundary_bytes = Ti * H * A;

  // Saved internals of a recompute-free backward (activations in act_bytes, statistics in fp32):
  // common to every kind: xn = RMSNorm(x) [H], h = x + mixer [H], hn = RMSNorm(h) [H], gate, up,
  // silu(gate)*up [3F], two norm rstd per token; plus the mixer's own (model/mixer_*.cpp).
  const int64_t act_elems = 3 * H + 3 * F + mx.saved_act;
  const int64_t f32_elems = 2 + mx.saved_f32;
  r.internal_bytes = Ti * (act_elems * A + f32_elems * 4);

  // Transient peak beyond the saved internals and the boundaries (see docs/model.md); the MLP's F-wide buffers hold
  // one pass of R = mlp_pass_rows rows (all T below ~1 GiB of them):
  //  forward with nothing retained: hn + gate + up + act live at once inside the MLP       T*H + R*3F
  //  backward MLP: d(act), d(gate), d(up) + d(hn) + dh                                      R*3F + T*2H
  //  backward mixer: its gradients of internals + dxn + dh, and its fp32 accumulators       T*(bwd_act+2H) + 4*T*bwd_f32
  const int64_t R = mlp_pass_rows(c, Ti);
  const int64_t fwd = (Ti * H + R * 3 * F) * A;
  const int64_t bwd_mlp = (R * 3 * F + Ti * 2 * H) * A;
  const int64_t bwd_mix = Ti * (mx.bwd_act + 2 * H) * A + Ti * mx.bwd_f32 * 4;
  r.workspace_bytes = std::max({fwd, bwd_mlp, bwd_mix});
  return r;
}

LayerCost layer_cost_at(const ModelConfig& c, int64_t layer, int64_t batch, int64_t seq, int act_bytes) {
  LT_CHECK(layer >= 0 && layer < c.layers, "layer_cost: layer {} outside [0, {})", layer, c.layers);
  return layer_cost(c, c.kind(layer), batch, seq, act_bytes);
}

LayerCost layer_cost(const ModelConfig& c, int64_t batch, int64_t seq, int act_bytes) {
  LT_CHECK(!c.hybrid(), "layer_cost: {} mixes layer kinds; ask for a kind or a layer", c.name);
  return layer_cost(c, LayerKind::Attention, batch, seq, act_bytes);
}

LayersFlops all_layers_flops(const ModelConfig& c, int64_t batch, int64_t seq) {
  LayersFlops f;
  for (LayerKind k : {LayerKind::Attention, LayerKind::GatedDeltaNet}) {
    const int64_t n = c.count(k);
    if (n == 0) continue;
    auto lc = layer_cost(c, k, batch, seq);
    f.fwd += double(n) * lc.flops_fwd;
    f.bwd += double(n) * lc.flops_bwd;
  }
  return f;
}

double model_flops_per_step(const ModelConfig& c, int64_t tokens) {
  return 6.0 * double(parameter_count(c)) * double(tokens);
}

StepRows full_rows(int64_t rows, int64_t seq) {
  return StepRows{rows * seq, double(rows) * double(seq) * double(seq)};
}

void add_row(StepRows& r, const int32_t* seg, int64_t seq) {
  r.tokens += seq;
  for_each_segment_run(seg, seq, [&](int64_t b, int64_t e) { r.sum_sq_len += double(e - b) * double(e - b); });
}

double sequence_mixer_flops(const ModelConfig& c, const StepRows& rows) {
  LT_CHECK(rows.tokens >= 0 && rows.sum_sq_len >= 0, "sequence_mixer_flops: negative rows ({} tokens, {} sum len^2)",
           rows.tokens, rows.sum_sq_len);
  // Causal attention: QK^T and PV, each 2 * len^2 * q_dim at full size and half of it causal (mixer_attention.cpp).
  const double attn_fwd = 2.0 * double(c.q_dim()) * rows.sum_sq_len;
  double fwd = double(c.count(LayerKind::Attention)) * attn_fwd;
  const int64_t n_gdn = c.count(LayerKind::GatedDeltaNet);
  if (n_gdn > 0 && rows.tokens > 0)
    fwd += double(n_gdn) * mixer_spec(LayerKind::GatedDeltaNet).cost(c, 1, rows.tokens).seq_flops_fwd;
  return 3.0 * fwd;  // backward = 2x forward
}

double model_flops_with_attention(const ModelConfig& c, const StepRows& rows) {
  return model_flops_per_step(c, rows.tokens) + sequence_mixer_flops(c, rows);
}

double head_flops_fwd(const ModelConfig& c, int64_t tokens) {
  return 2.0 * double(tokens) * double(c.hidden) * double(c.vocab);
}

int64_t parameter_count(const ModelConfig& c) {
  int64_t n = c.vocab * c.hidden;              // embedding
  for (int64_t i = 0; i < c.layers; ++i) n += layer_params(c, i).all;  // decoder layers
  n += c.hidden;                               // final norm
  if (!c.tied) n += c.vocab * c.hidden;        // separate LM head
  return n;
}

int64_t unit_param_count(const UnitLayout& u) {
  int64_t n = 0;
  for (auto& p : u.params) n += p.numel;
  return n;
}

int64_t head_chunk_workspace_bytes(const ModelConfig& c, int64_t chunk_tokens) {
  // fp32 logits of the chunk and their bf16 gradient (softmax - onehot), as the CUDA head carves them
  // (backend/cuda/layer/layer.cpp LayerEngine::head_workspace_bytes).
  return chunk_tokens * c.vocab * (4 + 2);
}

int64_t head_workspace_bytes(const ModelConfig& c, int64_t tokens, int64_t chunk_rows) {
  return tokens * (2 * c.hidden * 2 + 2 * 4) + head_chunk_workspace_bytes(c, std::min(chunk_rows, tokens));
}

int64_t mlp_pass_bound(const ModelConfig& c) {
  const int64_t per_row = 6 * std::max<int64_t>(c.ffn, 1);
  return std::max<int64_t>(1024, (int64_t(1) << 30) / per_row / 256 * 256);
}

int64_t mlp_pass_rows(const ModelConfig& c, int64_t T, int64_t bound) {
  const int64_t most = bound > 0 ? bound : mlp_pass_bound(c);
  if (T <= most) return std::max<int64_t>(T, 1);
  const int64_t passes = (T + most - 1) / most;
  return (T + passes - 1) / passes;
}

int64_t head_grad_slice_rows(const ModelConfig& c) {
  const int64_t floats = (int64_t(256) << 20) / 4;
  const int64_t rows = floats / std::max<int64_t>(c.hidden, 1) / 256 * 256;  // whole GEMM tiles
  return std::clamp<int64_t>(rows, 1, std::max<int64_t>(c.vocab, 1));
}

}  // namespace lt
