// Gated DeltaNet (Qwen3.5/3.6 linear-attention layers, HF Qwen3_5GatedDeltaNet): in_proj_qkv ->
// depthwise causal conv1d + SiLU -> L2-normalised q, k; gates g = -exp(A_log) softplus(a + dt_bias),
// beta = sigmoid(b); the chunked gated delta rule; gated RMSNorm with silu(z); out_proj.
#include "model/mixer.h"

namespace lt {

namespace {

std::vector<ParamDecl> deltanet_params(const ModelConfig& c) {
  const auto& l = c.linear;
  const int64_t H = c.hidden;
  return {
      {"linear_attn.in_proj_qkv.weight", {l.conv_dim(), H}, true, true},
      {"linear_attn.in_proj_z.weight", {l.value_dim(), H}, true, true},
      {"linear_attn.in_proj_b.weight", {l.v_heads, H}, true, true},
      {"linear_attn.in_proj_a.weight", {l.v_heads, H}, true, true},
      {"linear_attn.conv1d.weight", {l.conv_dim(), 1, l.conv_kernel}, true, false},
      {"linear_attn.dt_bias", {l.v_heads}, false, false},
      {"linear_attn.A_log", {l.v_heads}, false, false},
      {"linear_attn.norm.weight", {l.v_head_dim}, false, false},
      {"linear_attn.out_proj.weight", {H, l.value_dim()}, true, true},
  };
}

MixerCost deltanet_cost(const ModelConfig& c, int64_t batch, int64_t seq) {
  const auto& l = c.linear;
  const double T = double(batch) * double(seq);
  const double C = double(kDeltaRuleChunk), Dk = double(l.k_head_dim), Dv = double(l.v_head_dim);
  MixerCost m;
  // Per token and value head: five lower-triangular chunk matmuls counted at half (K K^T, Q K^T,
  // T (beta K), T (beta V), A V_new: C*(3 Dk + 2 Dv)) and three state products (W S, Q S, K^T V_new:
  // 6 Dk Dv); plus the depthwise conv (2 K per channel).
  const double rule = C * (3.0 * Dk + 2.0 * Dv) + 6.0 * Dk * Dv;
  m.core_flops_fwd = T * (double(l.v_heads) * rule + 2.0 * double(l.conv_kernel) * double(l.conv_dim()));
  m.seq_flops_fwd = T * double(l.v_heads) * rule;
  // qkv before and after the conv, z, a, b, rule output, gated-norm output.
  m.saved_act = 2 * l.conv_dim() + l.value_dim() + 2 * l.v_heads + 2 * l.value_dim();
  // g, beta, L2-norm statistics of q and k, gated-norm rstd; and the fp32 recurrent state at every
  // chunk start (Hv * Dk * Dv per chunk of kDeltaRuleChunk tokens), which the backward needs.
  m.saved_f32 = 2 * l.v_heads + 2 * l.k_heads + l.v_heads +
                (l.v_heads * l.k_head_dim * l.v_head_dim + kDeltaRuleChunk - 1) / kDeltaRuleChunk;
  // Gradients of qkv (pre/post conv), z, rule output; fp32 dq/dk/dv/dg/dbeta of the rule and its
  // chunk states (recomputed from the saved inputs when not kept).
  m.bwd_act = 2 * l.conv_dim() + 2 * l.value_dim() + 2 * l.v_heads;
  m.bwd_f32 = l.conv_dim() + 2 * l.v_heads +
              (l.v_heads * l.k_head_dim * l.v_head_dim + kDeltaRuleChunk - 1) / kDeltaRuleChunk;
  return m;
}

}  // namespace

extern const MixerSpec kDeltaNetMixer;
const MixerSpec kDeltaNetMixer = {LayerKind::GatedDeltaNet, "linear_attn", deltanet_params, deltanet_cost};

}  // namespace lt
