// Bytes and FLOPs per layer. Formulas and the exact list of saved tensors are in docs/model.md
// ("Accounting"); keep the two in step.
#include "model/accounting.h"

#include <algorithm>

#include "core/error.h"
#include "model/param_layout.h"

namespace lt {

namespace {

struct LayerParams {
  int64_t all = 0;
  int64_t matmul = 0;  // 2-D weights (the ones that cost 2 FLOPs per token per element)
};

LayerParams layer_params(const ModelConfig& c) {
  LayerParams p;
  for (auto& pi : layer_unit_layout(c, 0).params) {
    p.all += pi.numel;
    if (pi.is_matrix) p.matmul += pi.numel;
  }
  return p;
}

}  // namespace

LayerCost layer_cost(const ModelConfig& c, int64_t batch, int64_t seq, int act_bytes) {
  LT_CHECK(batch > 0 && seq > 0, "layer_cost: batch and seq must be positive, got {} x {}", batch, seq);
  LT_CHECK(act_bytes == 2 || act_bytes == 4, "layer_cost: act_bytes must be 2 or 4, got {}", act_bytes);
  const double T = double(batch) * double(seq);
  const int64_t Ti = batch * seq;
  const int64_t H = c.hidden, Q = c.q_dim(), KV = c.kv_dim(), F = c.ffn;
  auto lp = layer_params(c);

  LayerCost r;
  r.params = lp.all;
  // Matmuls: 2 FLOPs per weight element per token. Attention: QK^T and PV are each 2*S*S*q_dim per
  // sample at full size; causal masking halves them: 2 * (2*B*S^2*Q) / 2.
  const double matmul_fwd = 2.0 * T * double(lp.matmul);
  const double attn_fwd = 2.0 * 2.0 * double(batch) * double(seq) * double(seq) * double(Q) / 2.0;
  r.flops_fwd = matmul_fwd + attn_fwd;
  // Backward: each matmul needs two (grad input, grad weight); attention likewise (dQ,dK from dS; dV,dP).
  r.flops_bwd = 2.0 * r.flops_fwd;

  const int64_t A = act_bytes;
  r.boundary_bytes = Ti * H * A;

  // Saved internals of a recompute-free backward (activations in act_bytes, statistics in fp32):
  //   xn = RMSNorm(x) [H], q,k,v after RoPE [Q+2KV], (+ q,k before QK-norm [Q+KV]), attention
  //   output before o_proj [Q], h = x + attn [H], hn = RMSNorm(h) [H], gate, up, silu(gate)*up [3F];
  //   fp32: two norm rstd per token, softmax log-sum-exp per head, (+ per-head QK-norm rstd).
  int64_t act_elems = H + Q + 2 * KV + Q + H + H + 3 * F;
  int64_t f32_elems = 2 + c.heads;
  if (c.qk_norm) {
    act_elems += Q + KV;
    f32_elems += c.heads + c.kv_heads;
  }
  r.internal_bytes = Ti * (act_elems * A + f32_elems * 4);

  // Transient peak beyond the saved internals and the boundaries (see docs/model.md):
  //  forward with nothing retained: hn + gate + up + act live at once inside the MLP       T*(H+3F)
  //  backward MLP: d(act), d(gate), d(up) + d(hn) + dh                                      T*(3F+2H)
  //  backward attention: d(attn out), dq, dk, dv + dxn + dh, and an fp32 dq accumulator     T*(2Q+2KV+2H) + 4*T*Q
  const int64_t fwd = Ti * (H + 3 * F) * A;
  const int64_t bwd_mlp = Ti * (3 * F + 2 * H) * A;
  const int64_t bwd_attn = Ti * (2 * Q + 2 * KV + 2 * H) * A + Ti * Q * 4;
  r.workspace_bytes = std::max({fwd, bwd_mlp, bwd_attn});
  return r;
}

double model_flops_per_step(const ModelConfig& c, int64_t tokens) {
  return 6.0 * double(parameter_count(c)) * double(tokens);
}

double head_flops_fwd(const ModelConfig& c, int64_t tokens) {
  return 2.0 * double(tokens) * double(c.hidden) * double(c.vocab);
}

int64_t parameter_count(const ModelConfig& c) {
  int64_t n = c.vocab * c.hidden;              // embedding
  n += c.layers * layer_params(c).all;         // decoder layers
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
  // fp32 logits of the chunk and their gradient (softmax - onehot), written in place or beside.
  return 2 * chunk_tokens * c.vocab * 4;
}

}  // namespace lt
