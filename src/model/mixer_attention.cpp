// Causal grouped-query softmax attention: Qwen2 (q/k/v bias), Qwen3 (QK-norm), Llama-3, and Qwen3.5's
// full-attention layers (QK-norm, a sigmoid output gate produced by q_proj, partial RoPE).
#include "model/mixer.h"

namespace lt {

namespace {

std::vector<ParamDecl> attention_params(const ModelConfig& c) {
  const int64_t H = c.hidden, Q = c.q_dim(), KV = c.kv_dim();
  // With the output gate, q_proj yields [heads, 2 * head_dim]: each head's query, then its gate.
  const int64_t q_out = c.attn_output_gate ? 2 * Q : Q;
  std::vector<ParamDecl> p;
  p.push_back({"self_attn.q_proj.weight", {q_out, H}, true, true});
  if (c.attn_bias) p.push_back({"self_attn.q_proj.bias", {q_out}, false, false});
  p.push_back({"self_attn.k_proj.weight", {KV, H}, true, true});
  if (c.attn_bias) p.push_back({"self_attn.k_proj.bias", {KV}, false, false});
  p.push_back({"self_attn.v_proj.weight", {KV, H}, true, true});
  if (c.attn_bias) p.push_back({"self_attn.v_proj.bias", {KV}, false, false});
  if (c.qk_norm) {
    p.push_back({"self_attn.q_norm.weight", {c.head_dim}, false, false});
    p.push_back({"self_attn.k_norm.weight", {c.head_dim}, false, false});
  }
  p.push_back({"self_attn.o_proj.weight", {H, Q}, true, true});
  return p;
}

MixerCost attention_cost(const ModelConfig& c, int64_t batch, int64_t seq) {
  const int64_t Q = c.q_dim(), KV = c.kv_dim();
  MixerCost m;
  // QK^T and PV are each 2*S*S*q_dim per sample at full size; causal masking halves them.
  m.core_flops_fwd = 2.0 * 2.0 * double(batch) * double(seq) * double(seq) * double(Q) / 2.0;
  m.seq_flops_fwd = m.core_flops_fwd;
  // q, k, v after RoPE, attention output before o_proj; (+ q, k before QK-norm); (+ gate, gated output).
  m.saved_act = Q + 2 * KV + Q + (c.qk_norm ? Q + KV : 0) + (c.attn_output_gate ? 2 * Q : 0);
  m.saved_f32 = c.heads + (c.qk_norm ? c.heads + c.kv_heads : 0);  // softmax lse (+ QK-norm rstd)
  // d(attn out), dq, dk, dv (+ d gate) and an fp32 dq accumulator.
  m.bwd_act = 2 * Q + 2 * KV + (c.attn_output_gate ? Q : 0);
  m.bwd_f32 = Q;
  return m;
}

}  // namespace

extern const MixerSpec kAttentionMixer;
const MixerSpec kAttentionMixer = {LayerKind::Attention, "self_attn", attention_params, attention_cost};

}  // namespace lt
