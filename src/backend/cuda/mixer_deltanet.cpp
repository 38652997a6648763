// Gated DeltaNet mixer on the GPU (HF Qwen3_5GatedDeltaNet, CPU reference mixer_deltanet_ref.cpp):
// in_proj_qkv/z/b/a (cuBLASLt) -> depthwise causal conv1d + SiLU over the q, k, v channels -> L2-normalised
// q, k and the gates g, beta ("prep") -> the chunked gated delta rule -> gated RMSNorm with silu(z) ->
// out_proj, through the kernels of deltanet.h. The conv window and the recurrent state restart at every
// sample and packed-segment start.
//
// The four input projections are four GEMMs: their weights are adjacent in the unit layout, but the
// kernels read z, a and b as contiguous [T, *] tensors, so one GEMM over the concatenated weights would
// need a strided copy of its output (a possible later optimisation; the two small GEMMs have N = Hv).
#include <algorithm>

#include "backend/cuda/deltanet.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mixer.h"
#include "core/error.h"

namespace lt::cuda {

namespace {
using u16 = uint16_t;

// Buffers, carved in the same order for the forward and the backward.
struct GdnBufs {
  // forward internals (bf16 unless noted)
  u16 *qkv, *z, *b, *a, *y, *qn, *kn, *v, *o, *gout;
  float *g, *beta, *rstd, *states;
  // backward
  u16 *do_, *dz, *dy, *da, *db, *dqkv;
  float *dqn, *dkn, *dv, *dg, *dbeta;
  void* kws;  // the kernels' backward workspace (the largest of them; they run one after another)
};

GdnDims gdn_dims(const ModelConfig& c, int64_t batch, int64_t seq) {
  const auto& l = c.linear;
  GdnDims d;
  d.batch = batch;
  d.seq = seq;
  d.Hk = l.k_heads;
  d.Hv = l.v_heads;
  d.Dk = l.k_head_dim;
  d.Dv = l.v_head_dim;
  d.K = l.conv_kernel;
  return d;
}

template <typename C>
GdnBufs carve_gdn(C& cv, const GdnDims& d) {
  const int64_t T = d.tokens(), CH = d.conv_ch(), KD = d.Hk * d.Dk, VD = d.Hv * d.Dv, NV = d.Hv;
  GdnBufs b{};
  b.qkv = cv.template take<u16>(T * CH);
  b.z = cv.template take<u16>(T * VD);
  b.b = cv.template take<u16>(T * NV);
  b.a = cv.template take<u16>(T * NV);
  b.y = cv.template take<u16>(T * CH);
  b.qn = cv.template take<u16>(T * KD);
  b.kn = cv.template take<u16>(T * KD);
  b.v = cv.template take<u16>(T * VD);
  b.o = cv.template take<u16>(T * VD);
  b.gout = cv.template take<u16>(T * VD);
  b.g = cv.template take<float>(T * NV);
  b.beta = cv.template take<float>(T * NV);
  b.rstd = cv.template take<float>(T * NV);
  b.states = cv.template take<float>((gdn_rule_state_bytes(d) + 3) / 4);
  b.do_ = cv.template take<u16>(T * VD);
  b.dz = cv.template take<u16>(T * VD);
  b.dy = cv.template take<u16>(T * CH);
  b.da = cv.template take<u16>(T * NV);
  b.db = cv.template take<u16>(T * NV);
  b.dqkv = cv.template take<u16>(T * CH);
  b.dqn = cv.template take<float>(T * KD);
  b.dkn = cv.template take<float>(T * KD);
  b.dv = cv.template take<float>(T * VD);
  b.dg = cv.template take<float>(T * NV);
  b.dbeta = cv.template take<float>(T * NV);
  const int64_t kws = std::max({gdn_conv_bwd_workspace_bytes(d), gdn_prep_bwd_workspace_bytes(d),
                                gdn_rule_bwd_workspace_bytes(d), gdn_rule_fwd_workspace_bytes(d),
                                gdn_gated_norm_bwd_workspace_bytes(d), int64_t(1)});
  b.kws = cv.template take<char>(kws);
  return b;
}

class DeltaNetMixer final : public Mixer {
 public:
  DeltaNetMixer(const ModelConfig& c, Gemm& gemm) : c_(c), gemm_(gemm) {
    const auto& l = c.linear;
    const GdnDims d = gdn_dims(c, 1, 1);
    LT_CHECK(gdn_dims_supported(d),
             "CUDA backend: the Gated DeltaNet shape of {} is not supported on the GPU (key heads {} x {}, value "
             "heads {} x {}, conv kernel {}; the kernels need head dims that are multiples of 8 up to 128, a conv "
             "kernel of 1..8 and value heads a multiple of key heads)",
             c.name, l.k_heads, l.k_head_dim, l.v_heads, l.v_head_dim, l.conv_kernel);
  }

  int64_t workspace_bytes(int64_t batch, int64_t seq) const override {
    Carve cv(nullptr);
    carve_gdn(cv, gdn_dims(c_, batch, seq));  // the chunk-start states: batch * ceil(seq / 64) of them
    return cv.used;
  }

  void forward(const MixerCall& m, const void* h, const void* res, void* x1) override {
    const int64_t T = m.g.tokens(), H = c_.hidden, CH = c_.linear.conv_dim(), VD = c_.linear.value_dim();
    const int64_t NV = c_.linear.v_heads;
    d_ = gdn_dims(c_, m.g.batch, m.g.seq);
    b_ = carve_gdn(m.ws, d_);
    const Linear L{gemm_, T, m.st};
    const UnitLayout& lay = m.lay;
    L.fwd(h, wptr(m.w, lay, "linear_attn.in_proj_qkv.weight"), nullptr, b_.qkv, CH, H, 0, 0.f);
    L.fwd(h, wptr(m.w, lay, "linear_attn.in_proj_z.weight"), nullptr, b_.z, VD, H, 0, 0.f);
    L.fwd(h, wptr(m.w, lay, "linear_attn.in_proj_b.weight"), nullptr, b_.b, NV, H, 0, 0.f);
    L.fwd(h, wptr(m.w, lay, "linear_attn.in_proj_a.weight"), nullptr, b_.a, NV, H, 0, 0.f);
    gdn_conv_silu_fwd(d_, b_.qkv, CH, wptr(m.w, lay, "linear_attn.conv1d.weight"), m.g.segments, b_.y, m.st);
    gdn_prep_fwd(d_, b_.y, b_.a, b_.b, wptr(m.w, lay, "linear_attn.A_log"), wptr(m.w, lay, "linear_attn.dt_bias"),
                 b_.qn, b_.kn, b_.v, b_.g, b_.beta, m.st);
    gdn_rule_fwd(d_, b_.qn, b_.kn, b_.v, b_.g, b_.beta, m.g.segments, b_.o, b_.states, m.st, b_.kws);
    gdn_gated_norm_fwd(d_, b_.o, b_.z, wptr(m.w, lay, "linear_attn.norm.weight"), float(c_.rms_eps), b_.gout,
                       b_.rstd, m.st);
    L.fwd(b_.gout, wptr(m.w, lay, "linear_attn.out_proj.weight"), nullptr, x1, H, VD, 0, 1.f, res);  // x1 = res + .
  }

  void backward(const MixerCall& m, const void* h, const void* dx1, void* dh, float* dw) override {
    const int64_t T = m.g.tokens(), H = c_.hidden, CH = c_.linear.conv_dim(), VD = c_.linear.value_dim();
    const int64_t NV = c_.linear.v_heads;
    const Linear L{gemm_, T, m.st};
    const UnitLayout& lay = m.lay;
    const u16* A_log = wptr(m.w, lay, "linear_attn.A_log");
    const u16* dt_bias = wptr(m.w, lay, "linear_attn.dt_bias");
    L.dw(dx1, 0, b_.gout, gptr(dw, lay, "linear_attn.out_proj.weight"), H, VD);
    u16* dgout = b_.gout;  // consumed by the GEMM above (same stream): its buffer takes d gout
    L.dx(dx1, 0, wptr(m.w, lay, "linear_attn.out_proj.weight"), dgout, H, VD, 0.f);
    gdn_gated_norm_bwd(d_, b_.o, b_.z, wptr(m.w, lay, "linear_attn.norm.weight"), float(c_.rms_eps), b_.rstd, dgout,
                       b_.do_, b_.dz, gptr(dw, lay, "linear_attn.norm.weight"), b_.kws, m.st);
    gdn_rule_bwd(d_, b_.qn, b_.kn, b_.v, b_.g, b_.beta, m.g.segments, b_.states, b_.do_, b_.dqn, b_.dkn, b_.dv,
                 b_.dg, b_.dbeta, b_.kws, m.st);
    gdn_prep_bwd(d_, b_.y, b_.a, b_.b, A_log, dt_bias, b_.dqn, b_.dkn, b_.dv, b_.dg, b_.dbeta, b_.dy, b_.da, b_.db,
                 gptr(dw, lay, "linear_attn.A_log"), gptr(dw, lay, "linear_attn.dt_bias"), b_.kws, m.st);
    gdn_conv_silu_bwd(d_, b_.qkv, CH, wptr(m.w, lay, "linear_attn.conv1d.weight"), b_.dy, m.g.segments, b_.dqkv,
                      gptr(dw, lay, "linear_attn.conv1d.weight"), b_.kws, m.st);
    // Input projections: weight gradients, then dh = sum of the four dX products.
    L.dw(b_.dqkv, 0, h, gptr(dw, lay, "linear_attn.in_proj_qkv.weight"), CH, H);
    L.dw(b_.dz, 0, h, gptr(dw, lay, "linear_attn.in_proj_z.weight"), VD, H);
    L.dw(b_.db, 0, h, gptr(dw, lay, "linear_attn.in_proj_b.weight"), NV, H);
    L.dw(b_.da, 0, h, gptr(dw, lay, "linear_attn.in_proj_a.weight"), NV, H);
    L.dx(b_.dqkv, 0, wptr(m.w, lay, "linear_attn.in_proj_qkv.weight"), dh, CH, H, 0.f);
    L.dx(b_.dz, 0, wptr(m.w, lay, "linear_attn.in_proj_z.weight"), dh, VD, H, 1.f);
    L.dx(b_.db, 0, wptr(m.w, lay, "linear_attn.in_proj_b.weight"), dh, NV, H, 1.f);
    L.dx(b_.da, 0, wptr(m.w, lay, "linear_attn.in_proj_a.weight"), dh, NV, H, 1.f);
  }

 private:
  const ModelConfig c_;
  Gemm& gemm_;
  GdnDims d_{};
  GdnBufs b_{};  // this call's buffers (set by forward, used by the backward that follows)
};

}  // namespace

std::unique_ptr<Mixer> make_deltanet_mixer(const ModelConfig& c, Gemm& gemm) {
  return std::make_unique<DeltaNetMixer>(c, gemm);
}

}  // namespace lt::cuda
