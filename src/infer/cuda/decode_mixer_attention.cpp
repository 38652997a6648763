// Attention decode mixer (decode_mixer.h): q/k/v projections (+ bias), QK-norm, RoPE, the new rows' k/v
// appended to the KV cache, then causal attention within each prompt (prefill, flash kernels) or over each
// sequence's cache (decode step, decode.h), o_proj with the residual. Qwen3.5's full-attention layers add
// (ModelConfig flags; off for Qwen2/Qwen3/Llama, which then run exactly the kernels they always did):
//   attn_output_gate: q_proj yields per head (query, gate); the attention output is multiplied by
//                     sigmoid(gate) before o_proj (HF Qwen3_5Attention);
//   norm_plus_one:    QK-norm scales by (1 + w);
//   partial rotary:   RoPE rotates the first rotary_dim() entries of each head.
#include <cmath>

#include "infer/cuda/decode.h"
#include "infer/cuda/decode_mixer.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/layer/mixer.h"
#include "core/error.h"
#include "infer/decode_state.h"

namespace lt::cuda {
namespace {
using u16 = uint16_t;

class AttentionDecodeMixer final : public DecodeMixer {
 public:
  explicit AttentionDecodeMixer(const ModelConfig& c)
      : c_(c), rot_(c.rotary_dim()), noff_(c.norm_plus_one ? 1.f : 0.f),
        scale_(float(1.0 / std::sqrt(double(c.head_dim)))) {
    LT_CHECK(rot_ > 0 && rot_ % 2 == 0 && rot_ <= c.head_dim,
             "CUDA decoder: rotary dim {} (head_dim {} x partial_rotary_factor {}) must be even and in (0, head_dim]",
             rot_, c.head_dim, c.partial_rotary);
  }

  void forward(const DecodeMixerCall& m, const void* h, const void* res, void* x1) override {
    const DecodePass& p = m.pass;
    const int64_t T = p.rows, QD = c_.q_dim(), KD = c_.kv_dim();
    const AttnDecodeScratch sc = attn_decode_scratch(c_, T);
    u16* q = at_offset<u16>(m.scratch, sc.q);
    u16* k = at_offset<u16>(m.scratch, sc.k);
    u16* v = at_offset<u16>(m.scratch, sc.v);
    u16* o = at_offset<u16>(m.scratch, sc.o);
    u16* gate = c_.attn_output_gate ? at_offset<u16>(m.scratch, sc.gate) : nullptr;
    project(m, h, q, k, v, gate, c_.attn_output_gate ? at_offset<u16>(m.scratch, sc.qfull) : nullptr);
    const AttnDecodeState ss = attn_decode_state(c_, m.cap);
    u16* kc = at_offset<u16>(m.state, ss.k);
    u16* vc = at_offset<u16>(m.state, ss.v);
    kv_cache_append(k, v, T, KD, p.dst_row, kc, vc, m.st);
    if (p.prefill) {
      AttnDims d;
      d.batch = 1, d.seq = T, d.heads = c_.heads, d.kv_heads = c_.kv_heads, d.head_dim = c_.head_dim, d.scale = scale_;
      attention_fwd(d, q, k, v, p.seg, o, at_offset<float>(m.scratch, sc.lse), m.st);
    } else {
      DecodeAttnDims d;
      d.n = T, d.heads = c_.heads, d.kv_heads = c_.kv_heads, d.head_dim = c_.head_dim, d.max_len = p.max_len;
      d.scale = scale_;
      decode_attention(d, q, kc, vc, p.row0, p.len, o, p.attn_partial, m.st);
    }
    const u16* oin = o;
    if (gate) {  // HF: attn_output * sigmoid(gate); q is free after the attention
      sigmoid_gate_fwd(o, gate, T * QD, q, m.st);
      oin = q;
    }
    decode_linear(m.gemm, m.st, T, oin, wptr(m.w, m.lay, "self_attn.o_proj.weight"), nullptr, x1, c_.hidden, QD, 0,
                  res);
  }

 private:
  // q, k (after QK-norm and RoPE), v; with the output gate also the gate (qfull: q_proj's output).
  void project(const DecodeMixerCall& m, const void* h, u16* q, u16* k, u16* v, u16* gate, u16* qfull) const {
    const DecodePass& p = m.pass;
    const int64_t T = p.rows, H = c_.hidden, QD = c_.q_dim(), KD = c_.kv_dim(), hd = c_.head_dim;
    const float eps = float(c_.rms_eps);
    const UnitLayout& lay = m.lay;
    const u16* wq = wptr(m.w, lay, "self_attn.q_proj.weight");
    const u16* bq = wopt(m.w, lay, "self_attn.q_proj.bias");
    if (gate) {
      decode_linear(m.gemm, m.st, T, h, wq, bq, qfull, 2 * QD, H);
      split_halves(qfull, T * c_.heads, hd, q, gate, m.st);
    } else {
      decode_linear(m.gemm, m.st, T, h, wq, bq, q, QD, H);
    }
    const u16* wk = wptr(m.w, lay, "self_attn.k_proj.weight");
    const u16* wv = wptr(m.w, lay, "self_attn.v_proj.weight");
    decode_linear(m.gemm, m.st, T, h, wk, wopt(m.w, lay, "self_attn.k_proj.bias"), k, KD, H);
    decode_linear(m.gemm, m.st, T, h, wv, wopt(m.w, lay, "self_attn.v_proj.bias"), v, KD, H);
    if (c_.qk_norm) {
      rmsnorm_fwd(q, wptr(m.w, lay, "self_attn.q_norm.weight"), T * c_.heads, hd, eps, q, nullptr, m.st, noff_);
      rmsnorm_fwd(k, wptr(m.w, lay, "self_attn.k_norm.weight"), T * c_.kv_heads, hd, eps, k, nullptr, m.st, noff_);
    }
    rope_apply(q, nullptr, T, c_.heads, hd, p.pos, T, p.inv_freq, false, m.st, rot_);
    rope_apply(k, nullptr, T, c_.kv_heads, hd, p.pos, T, p.inv_freq, false, m.st, rot_);
  }

  const ModelConfig c_;
  int64_t rot_;
  float noff_, scale_;
};

}  // namespace

std::unique_ptr<DecodeMixer> make_attention_decode_mixer(const ModelConfig& c) {
  return std::make_unique<AttentionDecodeMixer>(c);
}

}  // namespace lt::cuda
