// Causal GQA attention mixer on the GPU: q/k/v projections (+ bias), QK-norm, RoPE, flash attention,
// o_proj. Qwen3.5's full-attention layers add (ModelConfig flags, all off for Qwen2/Qwen3/Llama, which
// then issue exactly the kernels and GEMMs they always did):
//   attn_output_gate: q_proj yields [T, heads, 2 * head_dim] = per head (query, gate); the attention
//                     output is multiplied by sigmoid(gate) before o_proj;
//   norm_plus_one:    QK-norm scales by (1 + w);
//   partial_rotary:   RoPE rotates the first rotary_dim() entries of each head.
// The attention core runs on cuDNN's fused flash attention where it takes the shape (attention_cudnn.h: Hopper
// kernels on sm_90; unpacked rows and packed ones whose runs the host counted), otherwise on our flash kernels
// (attention.cu; head_dim 256 on sm_90 only, the generic kernels elsewhere: attention_supported()).
#include <algorithm>
#include <cmath>

#include "backend/cuda/attention/attention_cudnn.h"
#include "backend/cuda/finite_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/layer/mixer.h"
#include "core/error.h"
#include "core/log.h"
#include "core/units.h"

namespace lt::cuda {

namespace {
using u16 = uint16_t;

// Buffers, carved in the same order for the forward and the backward.
struct AttnBufs {
  u16 *q, *o, *dout, *k, *v, *dk, *dv, *q_raw, *k_raw;
  u16 *qfull, *gate, *ag;  // gated only: q_proj output [T, 2Q], gate [T, Q], gated output [T, Q]
  u16* dq16;      // cuDNN path only: its bf16 dQ [T, Q]
  int32_t* pidx;  // cuDNN path only: packed rows' index tensors (packed_index_ints)
  float *lse, *delta, *dq_acc, *dkv_acc;
  float* ws;  // dq_acc and delta (our kernels) or cuDNN's backward workspace: ws_bytes
  size_t ws_bytes;
};

// Kept (the forward's outputs the backward reads) first, then scratch (the backward's own).
// ws_floats: AttentionMixer::ws_floats (our kernels' dQ accumulator and deltas, or cuDNN's backward workspace).
template <typename C>
AttnBufs carve_attn(C& keep, C& scratch, const ModelConfig& c, int64_t T, int64_t ws_floats, bool cudnn) {
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
  b.ws = scratch.template take<float>(ws_floats);
  b.ws_bytes = size_t(ws_floats) * sizeof(float);
  b.dq_acc = b.ws;
  b.delta = b.ws ? b.ws + T * QD : nullptr;
  b.dq16 = cudnn ? scratch.template take<u16>(T * QD) : nullptr;
  b.pidx = cudnn ? scratch.template take<int32_t>(packed_index_ints(T)) : nullptr;
  b.dkv_acc = attention_supported(c.head_dim) ? nullptr : scratch.template take<float>(2 * T * KD);
  return b;
}

class AttentionMixer final : public Mixer {
 public:
  AttentionMixer(const ModelConfig& c, Gemm& gemm, const float* inv_freq, const KernelOptions& k)
      : c_(c),
        cudnn_(cudnn_attention_built() && k.attention == AttnPath::Cudnn),
        packed_own_(k.attention_packed == AttnPath::Own),
        bwd_own_(k.attention_bwd == AttnPath::Own),
        check_finite_(k.check_finite),
        gemm_(gemm),
        inv_freq_(inv_freq),
        rot_(c.rotary_dim()),
        noff_(c.norm_plus_one ? 1.f : 0.f) {
    LT_CHECK(c.head_dim % 2 == 0 && c.head_dim % 8 == 0 && c.head_dim <= 256,
             "CUDA backend: head_dim {} is not supported (a multiple of 8 up to 256)", c.head_dim);
    LT_CHECK(rot_ > 0 && rot_ % 2 == 0 && rot_ <= c.head_dim,
             "CUDA backend: rotary dim {} (head_dim {} x partial_rotary_factor {}) must be even and in (0, head_dim]",
             rot_, c.head_dim, c.partial_rotary);
  }

  int64_t workspace_bytes(int64_t batch, int64_t seq) const override {
    Carve cv(nullptr);
    carve_attn(cv, cv, c_, batch * seq, ws_floats(batch, seq), cudnn_);
    return cv.used;
  }
  int64_t keep_bytes(int64_t batch, int64_t seq) const override {
    Carve kc(nullptr), sc(nullptr);
    carve_attn(kc, sc, c_, batch * seq, ws_floats(batch, seq), cudnn_);
    return kc.used;
  }
  void bind(const MixerCall& m) override {
    b_ = carve_attn(m.keep, m.scratch, c_, m.g.tokens(), ws_floats(m.g.batch, m.g.seq), cudnn_);
  }

  void forward(const MixerCall& m, const void* h, const void* res, void* x1) override {
    const int64_t T = m.g.tokens();
    bind(m);
    project_qkv(m, h);
    const PackedRows pr = packed(m.g);
    if (on_cudnn(m.g)) {
      cudnn_attention_fwd(dims(m.g), m.g.segments ? &pr : nullptr, b_.q, b_.k, b_.v, b_.o, b_.lse, m.st);
      if (m.g.segments) fwd_guard_.count(b_.o, T * c_.q_dim(), true, m.st);
    } else
      attention_fwd(dims(m.g), b_.q, b_.k, b_.v, m.g.segments, b_.o, b_.lse, m.st);
    if (check_finite_) probe_forward(m);
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
    u16* dq = b_.o;  // our kernels: o is free after them, dq (after inverse RoPE of the fp32 dQ) goes there
    const PackedRows pr = packed(m.g);
    if (bwd_on_cudnn(m.g)) {
      dq = b_.dq16;
      cudnn_attention_bwd(ad, m.g.segments ? &pr : nullptr, b_.q, b_.k, b_.v, b_.o, b_.lse, b_.dout, dq, b_.dk, b_.dv, b_.ws,
                          b_.ws_bytes, m.st);
      if (m.g.segments) {
        bwd_guard_.count(dq, T * QD, true, m.st);
        bwd_guard_.count(b_.dk, T * KD, true, m.st);
        bwd_guard_.count(b_.dv, T * KD, true, m.st);
      }
      rope_apply(dq, nullptr, T, nh, hd, m.g.positions, m.g.seq, inv_freq_, true, m.st, rot_);
    } else {
      attention_bwd_f32dq(ad, b_.q, b_.k, b_.v, m.g.segments, b_.o, b_.lse, b_.dout, b_.dk, b_.dv, b_.dq_acc, b_.delta,
                          b_.dkv_acc, m.st);
      rope_apply(dq, b_.dq_acc, T, nh, hd, m.g.positions, m.g.seq, inv_freq_, true, m.st, rot_);
    }
    if (check_finite_) probe_backward(m, dq);
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

  void prepare(const Geo& g) override { (void)on_cudnn(g); }  // builds and caches the graphs of g's shape

 private:
  Linear lin(const MixerCall& m) const { return Linear{gemm_, m.g.tokens(), m.st}; }

  // cuDNN takes the shapes it builds graphs for: unpacked rows, or packed ones whose runs the host counted. The
  // answer is cached per shape, so a forward and its backward (which must read the same softmax-statistics
  // layout) always agree.
  bool on_cudnn(const Geo& g) const {
    if (!cudnn_ || (g.segments && g.runs <= 0)) return false;
    if (g.segments && (packed_own_ || guard_tripped(fwd_guard_, "forward"))) return false;
    const PackedRows pr = packed(g);
    return cudnn_attention_usable(dims(g), g.segments ? &pr : nullptr);
  }
  // The packed rows of this call (used when g.segments is set), with the index scratch of the bound buffers.
  PackedRows packed(const Geo& g) const { return PackedRows{g.segments, g.runs, g.longest_run, b_.pidx}; }
  // One scratch block for our kernels' fp32 dQ accumulator and softmax deltas, or for cuDNN's backward workspace:
  // unpacked rows at this shape (built on the first query; the GPU profiler asks at the plan's shapes), packed
  // ones up to 4x the fp32 dQ (cuDNN sizes theirs by run slots x longest run; a batch wanting more takes our
  // backward, which reads the same statistics).
  int64_t ws_floats(int64_t batch, int64_t seq) const {
    const int64_t T = batch * seq, own = T * c_.q_dim() + 2 * T * c_.heads + 256;
    if (!cudnn_ || T == 0) return own;
    const int64_t dense = int64_t(cudnn_attention_bwd_workspace(dims(batch, seq)) + 3) / 4;
    return std::max({own, dense, 4 * T * c_.q_dim()});
  }
  // The backward on cuDNN: after a cuDNN forward, unless packed rows want more workspace than the block holds.
  bool bwd_on_cudnn(const Geo& g) const {
    if (!on_cudnn(g) || bwd_own_) return false;
    if (!g.segments) return true;
    if (guard_tripped(bwd_guard_, "backward")) return false;
    const PackedRows pr = packed(g);
    const size_t need = cudnn_attention_bwd_workspace(dims(g), &pr);
    if (need <= b_.ws_bytes) return true;
    if (!warned_ws_) {
      log_warn("attention: packed rows ({} runs, longest {}) want {} of cuDNN backward workspace, {} carved; this "
               "shape's backward runs on our kernels",
               g.runs, g.longest_run, format_bytes(double(need)), format_bytes(double(b_.ws_bytes)));
      warned_ws_ = true;
    }
    return false;
  }

  // LT_CHECK_FINITE=1: the attention core's inputs and outputs (finite_check.h), named with the path taken.
  std::string probe_where(const MixerCall& m, bool bwd) const {
    const bool cudnn = bwd ? bwd_on_cudnn(m.g) : on_cudnn(m.g);
    return fmt::format("layer {} attention {} ({}; batch {} x {}, {} runs, longest {})", m.lay.layer,
                       bwd ? "backward" : "forward", cudnn ? "cuDNN" : "own kernels", m.g.batch, m.g.seq, m.g.runs,
                       m.g.longest_run);
  }
  void probe_forward(const MixerCall& m) const {
    const int64_t T = m.g.tokens();
    const std::string w = probe_where(m, false);
    check_finite_bf16(b_.q, T * c_.q_dim(), w + ": q", m.st);
    check_finite_bf16(b_.k, T * c_.kv_dim(), w + ": k", m.st);
    check_finite_bf16(b_.v, T * c_.kv_dim(), w + ": v", m.st);
    check_finite_bf16(b_.o, T * c_.q_dim(), w + ": o", m.st);
    check_finite_f32(b_.lse, T * c_.heads, w + ": softmax statistics", m.st);
  }
  void probe_backward(const MixerCall& m, const u16* dq) const {
    const int64_t T = m.g.tokens();
    const std::string w = probe_where(m, true);
    check_finite_bf16(b_.dout, T * c_.q_dim(), w + ": d o", m.st);
    if (dq == b_.dq16) check_finite_bf16(dq, T * c_.q_dim(), w + ": d q", m.st);
    else check_finite_f32(b_.dq_acc, T * c_.q_dim(), w + ": d q (fp32)", m.st);
    check_finite_bf16(b_.dk, T * c_.kv_dim(), w + ": d k", m.st);
    check_finite_bf16(b_.dv, T * c_.kv_dim(), w + ": d v", m.st);
  }

  // Packed rows: cuDNN's outputs are watched for non-finite values (NonFiniteGuard); once one is seen, that direction
  // runs on our kernels for the rest of the process (the two read and write the same [T, heads] statistics, so either
  // direction can switch alone). Unpacked rows are not watched: there the forward and backward must take one path.
  bool guard_tripped(const NonFiniteGuard& guard, const char* direction) const {
    if (!guard.tripped()) return false;
    if (!guard_warned_[direction[0] == 'b']) {
      log_warn("attention: cuDNN's {} produced non-finite values on packed rows (layer of {}/{} heads, head_dim {}); "
               "lazytrain's own attention kernels run it from here on (the step where it happened is skipped)",
               direction, c_.heads, c_.kv_heads, c_.head_dim);
      guard_warned_[direction[0] == 'b'] = true;
    }
    return true;
  }

  AttnDims dims(const Geo& g) const { return dims(g.batch, g.seq); }
  AttnDims dims(int64_t batch, int64_t seq) const {
    AttnDims d;
    d.batch = batch;
    d.seq = seq;
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
  const bool cudnn_;        // carve cuDNN's bf16 dQ (the path itself: on_cudnn)
  const bool packed_own_;   // our kernels on packed rows (a check by hand)
  const bool bwd_own_;      // cuDNN's forward, our backward (a check by hand)
  const bool check_finite_;  // the finiteness probes (finite_check.h)
  Gemm& gemm_;
  const float* inv_freq_;
  int64_t rot_;
  float noff_;
  AttnBufs b_{};  // this call's buffers (set by forward, used by the backward that follows)
  mutable bool warned_ws_ = false;
  NonFiniteGuard fwd_guard_, bwd_guard_;     // cuDNN's packed-row outputs (guard_tripped)
  mutable bool guard_warned_[2] = {false, false};  // forward, backward
};

}  // namespace

std::unique_ptr<Mixer> make_attention_mixer(const ModelConfig& c, Gemm& gemm, const float* inv_freq,
                                            const KernelOptions& k) {
  return std::make_unique<AttentionMixer>(c, gemm, inv_freq, k);
}

}  // namespace lt::cuda
