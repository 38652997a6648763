// Causal GQA attention mixer on the GPU: q/k/v projections (+ bias), QK-norm, RoPE, flash attention,
// o_proj. Qwen3.5's full-attention layers add (ModelConfig flags, all off for Qwen2/Qwen3/Llama, which
// then issue exactly the kernels and GEMMs they always did):
//   attn_output_gate: q_proj yields [T, heads, 2 * head_dim] = per head (query, gate); the attention
//                     output is multiplied by sigmoid(gate) before o_proj;
//   norm_plus_one:    QK-norm scales by (1 + w);
//   partial_rotary:   RoPE rotates the first rotary_dim() entries of each head.
// Attention at head_dim 256 (Qwen3.5/3.6) runs on the flash kernels on sm_90 (attention.cu), on the
// generic kernels elsewhere (attention_supported()).
#include <cmath>

#include "backend/cuda/kernels.h"
#include "backend/cuda/mixer.h"
#include "core/error.h"

namespace lt::cuda {

namespace {
using u16 = uint16_t;

// Buffers, carved in the same order for the forward and the backward.
struct AttnBufs {
  u16 *q, *o, *dout, *k, *v, *dk, *dv, *q_raw, *k_raw;
  u16 *qfull, *gate, *ag;  // gated only: q_proj output [T, 2Q], gate [T, Q], gated output [T, Q]
  float *lse, *delta, *dq_acc, *dkv_acc;
};

// Kept (the forward's outputs the backward reads) first, then scratch (the backward's own).
template <typename C>
AttnBufs carve_attn(C& keep, C& scratch, const ModelConfig& c, int64_t T) {
  const int64_t QD = c.q_dim(), KD = c.kv_dim();
  AttnBufs b{};
  b.q = keep.template take<u16>(T * QD);
  b.o = keep.template take<u16>(T * QD);
  b.k = keep.template take<u16>(T * KD);
  b.v = keep.template take<u16>(T * KD);
  b.q_raw = c.qk_norm ? keep.template take<u16>(T * QD) : nullptr;
  b.k_raw = c.qk_norm ? keep.template take<u16>(T * KD) : nullptr;
  b.lse = keep.template take<float>(T * c.heads);
  if (c.attn_output_gate) {
    b.qfull = keep.template take<u16>(T * 2 * QD);
    b.gate = keep.template take<u16>(T * QD);
    b.ag = keep.template take<u16>(T * QD);
  }
  b.dout = scratch.template take<u16>(T * QD);
  b.dk = scratch.template take<u16>(T * KD);
  b.dv = scratch.template take<u16>(T * KD);
  b.delta = scratch.template take<float>(T * c.heads);
  b.dq_acc = scratch.template take<float>(T * QD);
  b.dkv_acc = attention_supported(c.head_dim) ? nullptr : scratch.template take<float>(2 * T * KD);
  return b;
}

class AttentionMixer final : public Mixer {
 public:
  AttentionMixer(const ModelConfig& c, Gemm& gemm, const float* inv_freq)
      : c_(c), gemm_(gemm), inv_freq_(inv_freq), rot_(c.rotary_dim()), noff_(c.norm_plus_one ? 1.f : 0.f) {
    LT_CHECK(c.head_dim % 2 == 0 && c.head_dim % 8 == 0 && c.head_dim <= 256,
             "CUDA backend: head_dim {} is not supported (a multiple of 8 up to 256)", c.head_dim);
    LT_CHECK(rot_ > 0 && rot_ % 2 == 0 && rot_ <= c.head_dim,
             "CUDA backend: rotary dim {} (head_dim {} x partial_rotary_factor {}) must be even and in (0, head_dim]",
             rot_, c.head_dim, c.partial_rotary);
  }

  int64_t workspace_bytes(int64_t batch, int64_t seq) const override {
    Carve cv(nullptr);
    carve_attn(cv, cv, c_, batch * seq);
    return cv.used;
  }
  int64_t keep_bytes(int64_t batch, int64_t seq) const override {
    Carve kc(nullptr), sc(nullptr);
    carve_attn(kc, sc, c_, batch * seq);
    return kc.used;
  }
  void bind(const MixerCall& m) override { b_ = carve_attn(m.keep, m.scratch, c_, m.g.tokens()); }

  void forward(const MixerCall& m, const void* h, const void* res, void* x1) override {
    const int64_t T = m.g.tokens();
    bind(m);
    project_qkv(m, h);
    attention_fwd(dims(m.g), b_.q, b_.k, b_.v, m.g.segments, b_.o, b_.lse, m.st);
    const u16* oin = b_.o;
    if (c_.attn_output_gate) {  // HF: attn_output * sigmoid(gate)
      sigmoid_gate_fwd(b_.o, b_.gate, T * c_.q_dim(), b_.ag, m.st);
      oin = b_.ag;
    }
    lin(m).fwd(oin, wptr(m.w, m.lay, "self_attn.o_proj.weight"), nullptr, x1, c_.hidden, c_.q_dim(), 0, 1.f, res);
  }

  void backward(const MixerCall& m, const void* h, const void* dx1, void* dh, float* dw) override {
    const int64_t T = m.g.tokens(), H = c_.hidden, QD = c_.q_dim(), KD = c_.kv_dim();
    const int64_t nh = c_.heads, nkv = c_.kv_heads, hd = c_.head_dim;
    const float eps = float(c_.rms_eps);
    const Linear L = lin(m);
    const UnitLayout& lay = m.lay;
    const bool gated = c_.attn_output_gate;
    L.dw(dx1, 0, gated ? b_.ag : b_.o, gptr(dw, lay, "self_attn.o_proj.weight"), H, QD);
    L.dx(dx1, 0, wptr(m.w, lay, "self_attn.o_proj.weight"), b_.dout, H, QD, 0.f);
    u16* dgate = b_.ag;  // the gated output is consumed: its buffer takes d gate
    if (gated) sigmoid_gate_bwd(b_.o, b_.gate, b_.dout, T * QD, b_.dout, dgate, m.st);
    const AttnDims ad = dims(m.g);
    attention_bwd_f32dq(ad, b_.q, b_.k, b_.v, m.g.segments, b_.o, b_.lse, b_.dout, b_.dk, b_.dv, b_.dq_acc, b_.delta,
                        b_.dkv_acc, m.st);
    u16* dq = b_.o;  // o is free now: dq (after inverse RoPE) goes there
    rope_apply(dq, b_.dq_acc, T, nh, hd, m.g.positions, m.g.seq, inv_freq_, true, m.st, rot_);
    rope_apply(b_.dk, nullptr, T, nkv, hd, m.g.positions, m.g.seq, inv_freq_, true, m.st, rot_);
    u16* dk = b_.dk;
    if (c_.qk_norm) {
      rmsnorm_bwd(b_.q_raw, wptr(m.w, lay, "self_attn.q_norm.weight"), dq, nullptr, T * nh, hd, eps, b_.q,
                  gptr(dw, lay, "self_attn.q_norm.weight"), m.ns.rstd, m.ns.partial, m.st, noff_);
      rmsnorm_bwd(b_.k_raw, wptr(m.w, lay, "self_attn.k_norm.weight"), dk, nullptr, T * nkv, hd, eps, b_.k,
                  gptr(dw, lay, "self_attn.k_norm.weight"), m.ns.rstd, m.ns.partial, m.st, noff_);
      dq = b_.q;
      dk = b_.k;
    }
    int64_t qo = QD;  // q_proj's output width
    if (gated) {      // d q_proj output: per head (d query, d gate)
      join_halves(dq, dgate, T * nh, hd, b_.qfull, m.st);
      dq = b_.qfull;
      qo = 2 * QD;
    }
    if (float* db = gopt(dw, lay, "self_attn.q_proj.bias")) colsum_accum(dq, T, qo, db, m.ns.partial, m.st);
    if (float* db = gopt(dw, lay, "self_attn.k_proj.bias")) colsum_accum(dk, T, KD, db, m.ns.partial, m.st);
    if (float* db = gopt(dw, lay, "self_attn.v_proj.bias")) colsum_accum(b_.dv, T, KD, db, m.ns.partial, m.st);
    L.dw(dq, 0, h, gptr(dw, lay, "self_attn.q_proj.weight"), qo, H);
    L.dw(dk, 0, h, gptr(dw, lay, "self_attn.k_proj.weight"), KD, H);
    L.dw(b_.dv, 0, h, gptr(dw, lay, "self_attn.v_proj.weight"), KD, H);
    L.dx(dq, 0, wptr(m.w, lay, "self_attn.q_proj.weight"), dh, qo, H, 0.f);
    L.dx(dk, 0, wptr(m.w, lay, "self_attn.k_proj.weight"), dh, KD, H, 1.f);
    L.dx(b_.dv, 0, wptr(m.w, lay, "self_attn.v_proj.weight"), dh, KD, H, 1.f);
  }

 private:
  Linear lin(const MixerCall& m) const { return Linear{gemm_, m.g.tokens(), m.st}; }

  AttnDims dims(const Geo& g) const {
    AttnDims d;
    d.batch = g.batch;
    d.seq = g.seq;
    d.heads = c_.heads;
    d.kv_heads = c_.kv_heads;
    d.head_dim = c_.head_dim;
    d.scale = float(1.0 / std::sqrt(double(c_.head_dim)));
    return d;
  }

  // q, k (after QK-norm and RoPE), v; with the output gate also the gate.
  void project_qkv(const MixerCall& m, const void* h) {
    const int64_t T = m.g.tokens(), H = c_.hidden, QD = c_.q_dim(), KD = c_.kv_dim();
    const int64_t nh = c_.heads, nkv = c_.kv_heads, hd = c_.head_dim;
    const float eps = float(c_.rms_eps);
    const Linear L = lin(m);
    const UnitLayout& lay = m.lay;
    u16* qpre = c_.qk_norm ? b_.q_raw : b_.q;
    u16* kpre = c_.qk_norm ? b_.k_raw : b_.k;
    const u16* wq = wptr(m.w, lay, "self_attn.q_proj.weight");
    const u16* bq = wopt(m.w, lay, "self_attn.q_proj.bias");
    if (c_.attn_output_gate) {
      L.fwd(h, wq, bq, b_.qfull, 2 * QD, H, 0, 0.f);
      split_halves(b_.qfull, T * nh, hd, qpre, b_.gate, m.st);
    } else {
      L.fwd(h, wq, bq, qpre, QD, H, 0, 0.f);
    }
    L.fwd(h, wptr(m.w, lay, "self_attn.k_proj.weight"), wopt(m.w, lay, "self_attn.k_proj.bias"), kpre, KD, H, 0, 0.f);
    L.fwd(h, wptr(m.w, lay, "self_attn.v_proj.weight"), wopt(m.w, lay, "self_attn.v_proj.bias"), b_.v, KD, H, 0, 0.f);
    if (c_.qk_norm) {
      rmsnorm_fwd(b_.q_raw, wptr(m.w, lay, "self_attn.q_norm.weight"), T * nh, hd, eps, b_.q, nullptr, m.st, noff_);
      rmsnorm_fwd(b_.k_raw, wptr(m.w, lay, "self_attn.k_norm.weight"), T * nkv, hd, eps, b_.k, nullptr, m.st, noff_);
    }
    rope_apply(b_.q, nullptr, T, nh, hd, m.g.positions, m.g.seq, inv_freq_, false, m.st, rot_);
    rope_apply(b_.k, nullptr, T, nkv, hd, m.g.positions, m.g.seq, inv_freq_, false, m.st, rot_);
  }

  const ModelConfig c_;
  Gemm& gemm_;
  const float* inv_freq_;
  int64_t rot_;
  float noff_;
  AttnBufs b_{};  // this call's buffers (set by forward, used by the backward that follows)
};

}  // namespace

std::unique_ptr<Mixer> make_attention_mixer(const ModelConfig& c, Gemm& gemm, const float* inv_freq) {
  return std::make_unique<AttentionMixer>(c, gemm, inv_freq);
}

}  // namespace lt::cuda
