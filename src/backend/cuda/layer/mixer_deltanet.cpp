// Gated DeltaNet mixer on the GPU (HF Qwen3_5GatedDeltaNet, CPU reference mixer_deltanet_ref.cpp):
// in_proj_qkv/z/b/a (cuBLASLt) -> depthwise causal conv1d + SiLU over the q, k, v channels -> L2-normalised
// q, k and the gates g, beta ("prep") -> the chunked gated delta rule -> gated RMSNorm with silu(z) ->
// out_proj, through the kernels of deltanet.h. The conv window and the recurrent state restart at every
// sample and packed-segment start.
//
// The four input projections write one [T, P] buffer (columns qkv | z | b | a, P rounded up to 8) that the
// kernels read as strided slices, and their gradients one buffer of the same layout: so where the four
// weights are adjacent in the unit layout (every real shape) they are one GEMM forward, one for dX and one
// for dW (the b and a projections have N = Hv = 48 at the 27B shape: alone they run at ~20 % of the GEMM
// rate); else four GEMMs on the column slices.
#include <algorithm>

#include "backend/cuda/deltanet/deltanet.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/layer/mixer.h"
#include "core/error.h"

namespace lt::cuda {

namespace {
using u16 = uint16_t;

// Buffers, carved in the same order for the forward and the backward.
struct GdnBufs {
  // forward internals (bf16 unless noted); qkv, z, b, a: column slices of proj [T, ldp]
  u16 *proj, *qkv, *z, *b, *a, *y, *qn, *kn, *v, *o, *gout;
  float *g, *beta, *rstd, *states;
  // backward; dqkv, dz, db, da: the same slices of dproj
  u16 *do_, *dproj, *dz, *dy, *da, *db, *dqkv;
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

// The input projections' columns: qkv | z | b | a (the weights' order in the unit layout).
struct ProjCols {
  int64_t qkv, z, b, a, n, ld;  // column offsets, the used width n, the row stride ld (n rounded up to 8)
};
ProjCols proj_cols(const GdnDims& d) {
  ProjCols p;
  p.qkv = 0;
  p.z = d.conv_ch();
  p.b = p.z + d.Hv * d.Dv;
  p.a = p.b + d.Hv;
  p.n = p.a + d.Hv;
  p.ld = (p.n + 7) / 8 * 8;
  return p;
}

// Kept (the forward's outputs the backward reads, the chunk-start states among them) first, then scratch (the
// backward's own buffers and the kernels' workspace, which the backward's passes refill per group of samples).
template <typename C>
GdnBufs carve_gdn(C& keep, C& scratch, const GdnDims& d) {
  const int64_t T = d.tokens(), CH = d.conv_ch(), KD = d.Hk * d.Dk, VD = d.Hv * d.Dv, NV = d.Hv;
  const ProjCols pc = proj_cols(d);
  GdnBufs b{};
  b.proj = keep.template take<u16>(T * pc.ld);
  b.qkv = b.proj + pc.qkv, b.z = b.proj + pc.z, b.b = b.proj + pc.b, b.a = b.proj + pc.a;
  b.y = keep.template take<u16>(T * CH);
  b.qn = keep.template take<u16>(T * KD);
  b.kn = keep.template take<u16>(T * KD);
  b.v = keep.template take<u16>(T * VD);
  b.o = keep.template take<u16>(T * VD);
  b.gout = keep.template take<u16>(T * VD);
  b.g = keep.template take<float>(T * NV);
  b.beta = keep.template take<float>(T * NV);
  b.rstd = keep.template take<float>(T * NV);
  b.states = keep.template take<float>((gdn_rule_state_bytes(d) + 3) / 4);
  b.do_ = scratch.template take<u16>(T * VD);
  b.dproj = scratch.template take<u16>(T * pc.ld);
  b.dqkv = b.dproj + pc.qkv, b.dz = b.dproj + pc.z, b.db = b.dproj + pc.b, b.da = b.dproj + pc.a;
  b.dy = scratch.template take<u16>(T * CH);
  b.dqn = scratch.template take<float>(T * KD);
  b.dkn = scratch.template take<float>(T * KD);
  b.dv = scratch.template take<float>(T * VD);
  b.dg = scratch.template take<float>(T * NV);
  b.dbeta = scratch.template take<float>(T * NV);
  const int64_t kws = std::max({gdn_conv_bwd_workspace_bytes(d), gdn_prep_bwd_workspace_bytes(d),
                                gdn_rule_bwd_workspace_bytes(d), gdn_rule_fwd_workspace_bytes(d),
                                gdn_gated_norm_bwd_workspace_bytes(d), int64_t(1)});
  b.kws = scratch.template take<char>(kws);
  return b;
}

constexpr const char* kInProj[4] = {"linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight",
                                    "linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"};
int64_t col(const ProjCols& p, int i) { return i == 0 ? p.qkv : i == 1 ? p.z : i == 2 ? p.b : p.a; }
int64_t width(const ProjCols& p, int i) { return (i == 3 ? p.n : col(p, i + 1)) - col(p, i); }
// Whether the four weights are one [n, H] matrix in the unit layout (so are their gradients): each ends where
// the next starts (the layout pads a tensor to kParamAlign elements; H a multiple of 64 keeps them adjacent).
bool in_proj_adjacent(const UnitLayout& lay) {
  for (int i = 0; i + 1 < 4; ++i) {
    const ParamInfo& p = lay.find(kInProj[i]);
    if (p.offset + p.numel != lay.find(kInProj[i + 1]).offset) return false;
  }
  return true;
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
    carve_gdn(cv, cv, gdn_dims(c_, batch, seq));  // the chunk-start states: batch * ceil(seq / 64) of them
    return cv.used;
  }
  int64_t keep_bytes(int64_t batch, int64_t seq) const override {
    Carve kc(nullptr), sc(nullptr);
    carve_gdn(kc, sc, gdn_dims(c_, batch, seq));
    return kc.used;
  }
  void bind(const MixerCall& m) override {
    d_ = gdn_dims(c_, m.g.batch, m.g.seq);
    b_ = carve_gdn(m.keep, m.scratch, d_);
  }

  void forward(const MixerCall& m, const void* h, const void* res, void* x1) override {
    const int64_t T = m.g.tokens(), H = c_.hidden, VD = c_.linear.value_dim();
    bind(m);
    const ProjCols pc = proj_cols(d_);
    const Linear L{gemm_, T, m.st};
    const UnitLayout& lay = m.lay;
    if (in_proj_adjacent(lay)) {
      L.fwd(h, wptr(m.w, lay, kInProj[0]), nullptr, b_.proj, pc.n, H, pc.ld, 0.f);
    } else {
      for (int i = 0; i < 4; ++i)
        L.fwd(h, wptr(m.w, lay, kInProj[i]), nullptr, b_.proj + col(pc, i), width(pc, i), H, pc.ld, 0.f);
    }
    gdn_conv_silu_fwd(d_, b_.qkv, pc.ld, wptr(m.w, lay, "linear_attn.conv1d.weight"), m.g.segments, b_.y, m.st);
    gdn_prep_fwd(d_, b_.y, b_.a, b_.b, pc.ld, wptr(m.w, lay, "linear_attn.A_log"),
                 wptr(m.w, lay, "linear_attn.dt_bias"), b_.qn, b_.kn, b_.v, b_.g, b_.beta, m.st);
    gdn_rule_fwd(d_, b_.qn, b_.kn, b_.v, b_.g, b_.beta, m.g.segments, b_.o, b_.states, m.st, b_.kws);
    gdn_gated_norm_fwd(d_, b_.o, b_.z, pc.ld, wptr(m.w, lay, "linear_attn.norm.weight"), float(c_.rms_eps), b_.gout,
                       b_.rstd, m.st);
    L.fwd(b_.gout, wptr(m.w, lay, "linear_attn.out_proj.weight"), nullptr, x1, H, VD, 0, 1.f, res);  // x1 = res + .
  }

  void backward(const MixerCall& m, const void* h, const void* dx1, void* dh, float* dw) override {
    const int64_t T = m.g.tokens(), H = c_.hidden, VD = c_.linear.value_dim();
    const ProjCols pc = proj_cols(d_);
    const Linear L{gemm_, T, m.st};
    const UnitLayout& lay = m.lay;
    const u16* A_log = wptr(m.w, lay, "linear_attn.A_log");
    const u16* dt_bias = wptr(m.w, lay, "linear_attn.dt_bias");
    L.dw(dx1, 0, b_.gout, gptr(dw, lay, "linear_attn.out_proj.weight"), H, VD);
    u16* dgout = b_.gout;  // consumed by the GEMM above (same stream): its buffer takes d gout
    L.dx(dx1, 0, wptr(m.w, lay, "linear_attn.out_proj.weight"), dgout, H, VD, 0.f);
    gdn_gated_norm_bwd(d_, b_.o, b_.z, pc.ld, wptr(m.w, lay, "linear_attn.norm.weight"), float(c_.rms_eps), b_.rstd,
                       dgout, b_.do_, b_.dz, gptr(dw, lay, "linear_attn.norm.weight"), b_.kws, m.st);
    gdn_rule_bwd(d_, b_.qn, b_.kn, b_.v, b_.g, b_.beta, m.g.segments, b_.states, b_.do_, b_.dqn, b_.dkn, b_.dv,
                 b_.dg, b_.dbeta, b_.kws, m.st);
    gdn_prep_bwd(d_, b_.y, b_.a, b_.b, pc.ld, A_log, dt_bias, b_.dqn, b_.dkn, b_.dv, b_.dg, b_.dbeta, b_.dy, b_.da,
                 b_.db, gptr(dw, lay, "linear_attn.A_log"), gptr(dw, lay, "linear_attn.dt_bias"), b_.kws, m.st);
    gdn_conv_silu_bwd(d_, b_.qkv, pc.ld, wptr(m.w, lay, "linear_attn.conv1d.weight"), b_.dy, m.g.segments, b_.dqkv,
                      gptr(dw, lay, "linear_attn.conv1d.weight"), b_.kws, m.st);
    // Input projections: weight gradients, then dh = sum of the four dX products.
    if (in_proj_adjacent(lay)) {
      L.dw(b_.dproj, pc.ld, h, gptr(dw, lay, kInProj[0]), pc.n, H);
      L.dx(b_.dproj, pc.ld, wptr(m.w, lay, kInProj[0]), dh, pc.n, H, 0.f);
      return;
    }
    for (int i = 0; i < 4; ++i) L.dw(b_.dproj + col(pc, i), pc.ld, h, gptr(dw, lay, kInProj[i]), width(pc, i), H);
    for (int i = 0; i < 4; ++i)
      L.dx(b_.dproj + col(pc, i), pc.ld, wptr(m.w, lay, kInProj[i]), dh, width(pc, i), H, i == 0 ? 0.f : 1.f);
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
