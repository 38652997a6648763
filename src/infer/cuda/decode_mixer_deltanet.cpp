// Gated DeltaNet decode mixer (decode_mixer.h; CPU reference: cpu::DeltaNetRef::prefill and
// cpu::deltanet_decode_step). in_proj_qkv/z/b/a, then
//   prefill: the training kernels over the packed prompts (batch 1, the prompts as segments: the conv and
//            the chunked rule restart at each prompt), and gdn_prefill_state writes each prompt's conv
//            window and recurrent state into its batch slot;
//   decode:  gdn_decode_step (conv update + SiLU, q/k L2 norm, gates, delta-rule update and output) on
//            the slots of the live sequences;
// then the gated RMSNorm with silu(z) and out_proj with the residual.
#include "infer/cuda/decode_mixer.h"
#include "backend/cuda/deltanet/deltanet.h"
#include "backend/cuda/layer/mixer.h"
#include "core/error.h"
#include "infer/decode_state.h"

namespace lt::cuda {
namespace {
using u16 = uint16_t;

class DeltaNetDecodeMixer final : public DecodeMixer {
 public:
  explicit DeltaNetDecodeMixer(const ModelConfig& c) : c_(c) {
    const auto& l = c.linear;
    LT_CHECK(gdn_dims_supported(dims(1, 1)),
             "CUDA decoder: the Gated DeltaNet shape of {} is not supported on the GPU (key heads {} x {}, value "
             "heads {} x {}, conv kernel {}; the kernels need head dims that are multiples of 8 up to 128, a conv "
             "kernel of 1..8 and value heads a multiple of key heads)",
             c.name, l.k_heads, l.k_head_dim, l.v_heads, l.v_head_dim, l.conv_kernel);
  }

  void forward(const DecodeMixerCall& m, const void* h, const void* res, void* x1) override {
    const DecodePass& p = m.pass;
    const int64_t T = p.rows, H = c_.hidden, C = c_.linear.conv_dim(), VD = c_.linear.value_dim();
    const int64_t NV = c_.linear.v_heads;
    const GdnDecodeScratch sc = gdn_decode_scratch(c_, T);
    const GdnDecodeState ss = gdn_decode_state(c_, m.cap);
    const UnitLayout& lay = m.lay;
    u16* qkv = at_offset<u16>(m.scratch, sc.qkv);
    u16* z = at_offset<u16>(m.scratch, sc.z);
    u16* a = at_offset<u16>(m.scratch, sc.a);
    u16* b = at_offset<u16>(m.scratch, sc.b);
    u16* o = at_offset<u16>(m.scratch, sc.o);
    u16* gout = at_offset<u16>(m.scratch, sc.gout);
    decode_linear(m.gemm, m.st, T, h, wptr(m.w, lay, "linear_attn.in_proj_qkv.weight"), nullptr, qkv, C, H);
    decode_linear(m.gemm, m.st, T, h, wptr(m.w, lay, "linear_attn.in_proj_z.weight"), nullptr, z, VD, H);
    decode_linear(m.gemm, m.st, T, h, wptr(m.w, lay, "linear_attn.in_proj_b.weight"), nullptr, b, NV, H);
    decode_linear(m.gemm, m.st, T, h, wptr(m.w, lay, "linear_attn.in_proj_a.weight"), nullptr, a, NV, H);
    float* conv_state = at_offset<float>(m.state, ss.conv);
    float* rec_state = at_offset<float>(m.state, ss.rec);
    if (p.prefill) {
      prefill(m, sc, qkv, a, b, conv_state, rec_state, o);
    } else {
      gdn_decode_step(dims(T, 1), qkv, C, wptr(m.w, lay, "linear_attn.conv1d.weight"), a, b,
                      wptr(m.w, lay, "linear_attn.A_log"), wptr(m.w, lay, "linear_attn.dt_bias"), conv_state,
                      rec_state, o, m.st, p.slot);
    }
    const GdnDims d = p.prefill ? dims(1, T) : dims(T, 1);
    gdn_gated_norm_fwd(d, o, z, VD, wptr(m.w, lay, "linear_attn.norm.weight"), float(c_.rms_eps), gout,
                       at_offset<float>(m.scratch, sc.rstd), m.st);
    decode_linear(m.gemm, m.st, T, gout, wptr(m.w, lay, "linear_attn.out_proj.weight"), nullptr, x1, H, VD, 0, res);
  }

 private:
  GdnDims dims(int64_t batch, int64_t seq) const {
    const auto& l = c_.linear;
    GdnDims d;
    d.batch = batch, d.seq = seq;
    d.Hk = l.k_heads, d.Hv = l.v_heads, d.Dk = l.k_head_dim, d.Dv = l.v_head_dim, d.K = l.conv_kernel;
    return d;
  }

  // The packed prompts as one sample of T rows, one segment per prompt: outputs o, and every prompt's
  // decoding state in its slot.
  void prefill(const DecodeMixerCall& m, const GdnDecodeScratch& sc, const u16* qkv, const u16* a, const u16* b,
               float* conv_state, float* rec_state, u16* o) const {
    const DecodePass& p = m.pass;
    const GdnDims d = dims(1, p.rows);
    const int64_t C = d.conv_ch();
    const UnitLayout& lay = m.lay;
    u16* y = at_offset<u16>(m.scratch, sc.y);
    u16* qn = at_offset<u16>(m.scratch, sc.qn);
    u16* kn = at_offset<u16>(m.scratch, sc.kn);
    u16* v = at_offset<u16>(m.scratch, sc.v);
    float* g = at_offset<float>(m.scratch, sc.g);
    float* beta = at_offset<float>(m.scratch, sc.beta);
    float* states = at_offset<float>(m.scratch, sc.chunk_states);
    LT_CHECK(sc.bytes - sc.chunk_states >= gdn_rule_state_bytes(d), "internal: decode scratch too small for {} rows",
             p.rows);
    gdn_conv_silu_fwd(d, qkv, C, wptr(m.w, lay, "linear_attn.conv1d.weight"), p.seg, y, m.st);
    gdn_prep_fwd(d, y, a, b, d.Hv, wptr(m.w, lay, "linear_attn.A_log"), wptr(m.w, lay, "linear_attn.dt_bias"), qn,
                 kn, v, g, beta, m.st);
    gdn_rule_fwd(d, qn, kn, v, g, beta, p.seg, o, states, m.st);
    gdn_prefill_state(d, p.seqs, p.last_rows, p.slot, qkv, C, kn, v, g, beta, states, conv_state, rec_state, m.st);
  }

  const ModelConfig c_;
};

}  // namespace

std::unique_ptr<DecodeMixer> make_deltanet_decode_mixer(const ModelConfig& c) {
  return std::make_unique<DeltaNetDecodeMixer>(c);
}

}  // namespace lt::cuda
