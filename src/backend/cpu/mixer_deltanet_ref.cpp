// Gated DeltaNet mixer (reference), HF Qwen3_5GatedDeltaNet: in_proj_qkv/z/b/a -> depthwise causal
// conv1d + SiLU over the q, k, v channels -> L2-normalised q, k -> gates g, beta -> the chunked gated
// delta rule (ops_gdn.h) -> gated RMSNorm with silu(z) -> out_proj. Packed samples: the conv window and
// the recurrent state restart at every segment start (HF's torch path lets them leak; docs/model.md).
#include <cstring>
#include <vector>

#include "backend/cpu/mixer_ref.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/ops_gdn.h"
#include "backend/cpu/scratch.h"
#include "model/mixer.h"

namespace lt::cpu {

namespace {

constexpr float kL2Eps = 1e-6f;  // HF l2norm's eps (FLA convention)

class DeltaNetRef final : public MixerRef {
 public:
  DeltaNetRef(const ModelConfig& c, const UnitLayout& lay, const float* w, float* dw, int64_t S)
      : c_(c), l_(c.linear), S_(S) {
    auto at = [&](const char* s) { return w + lay.find(s).offset; };
    auto dat = [&](const char* s) { return dw ? dw + lay.find(s).offset : nullptr; };
    wqkv_ = at("linear_attn.in_proj_qkv.weight"), wz_ = at("linear_attn.in_proj_z.weight");
    wb_ = at("linear_attn.in_proj_b.weight"), wa_ = at("linear_attn.in_proj_a.weight");
    conv_ = at("linear_attn.conv1d.weight"), dt_ = at("linear_attn.dt_bias"), alog_ = at("linear_attn.A_log");
    norm_ = at("linear_attn.norm.weight"), wout_ = at("linear_attn.out_proj.weight");
    dwqkv_ = dat("linear_attn.in_proj_qkv.weight"), dwz_ = dat("linear_attn.in_proj_z.weight");
    dwb_ = dat("linear_attn.in_proj_b.weight"), dwa_ = dat("linear_attn.in_proj_a.weight");
    dconv_ = dat("linear_attn.conv1d.weight"), ddt_ = dat("linear_attn.dt_bias"), dalog_ = dat("linear_attn.A_log");
    dnorm_ = dat("linear_attn.norm.weight"), dwout_ = dat("linear_attn.out_proj.weight");
    shape_ = GdnShape{S, l_.k_heads, l_.v_heads, l_.k_head_dim, l_.v_head_dim, kDeltaRuleChunk};

    const int64_t C = l_.conv_dim(), KD = l_.key_dim(), VD = l_.value_dim(), NV = l_.v_heads;
    // The four input projections are adjacent in the layout (model/mixer_deltanet.cpp): one GEMM over
    // them when their buffers are contiguous (tensor sizes multiples of the 64-element alignment).
    fused_ = wz_ == wqkv_ + C * c.hidden && wb_ == wz_ + VD * c.hidden && wa_ == wb_ + NV * c.hidden;
    const int64_t P = C + VD + 2 * NV;
    const int64_t fwd = 2 * C + VD + 2 * NV + 2 * KD + 2 * KD + VD + 2 * NV + 2 * VD + P;
    const int64_t bwd = dw ? VD + VD + VD + 2 * KD + 2 * KD + VD + 2 * NV + 2 * NV + 2 * C + P : 0;
    Scratch& sc = Scratch::get(2);
    sc.reset(S * (fwd + bwd), 34);
    proj_ = sc.take(S * P);
    qkv_ = sc.take(S * C), conv_out_ = sc.take(S * C), z_ = sc.take(S * VD);
    b_ = sc.take(S * NV), a_ = sc.take(S * NV);
    q0_ = sc.take(S * KD), k0_ = sc.take(S * KD), q_ = sc.take(S * KD), k_ = sc.take(S * KD);
    v_ = sc.take(S * VD), g_ = sc.take(S * NV), beta_ = sc.take(S * NV);
    o_ = sc.take(S * VD), y_ = sc.take(S * VD);
    if (dw) {
      dy_ = sc.take(S * VD), do_ = sc.take(S * VD), dz_ = sc.take(S * VD);
      dq_ = sc.take(S * KD), dk_ = sc.take(S * KD), dq0_ = sc.take(S * KD), dk0_ = sc.take(S * KD);
      dv_ = sc.take(S * VD), dg_ = sc.take(S * NV), dbeta_ = sc.take(S * NV);
      da_ = sc.take(S * NV), db_ = sc.take(S * NV), dconv_out_ = sc.take(S * C), dqkv_ = sc.take(S * C);
      dproj_ = sc.take(S * P);
    }
  }

  void forward(const SampleGeo& sg, const float* h, float* out) override {
    const int64_t S = S_, H = c_.hidden, C = l_.conv_dim(), KD = l_.key_dim(), VD = l_.value_dim();
    const int64_t NV = l_.v_heads;
    if (fused_) {
      const int64_t P = C + VD + 2 * NV;
      linear_fwd(h, wqkv_, nullptr, S, H, P, proj_);
      split_columns(proj_, S, P, {{qkv_, C}, {z_, VD}, {b_, NV}, {a_, NV}});
    } else {
      linear_fwd(h, wqkv_, nullptr, S, H, C, qkv_);
      linear_fwd(h, wz_, nullptr, S, H, VD, z_);
      linear_fwd(h, wb_, nullptr, S, H, NV, b_);
      linear_fwd(h, wa_, nullptr, S, H, NV, a_);
    }
    gdn_conv_silu_fwd(qkv_, conv_, S, C, l_.conv_kernel, sg.seg, conv_out_);
    // The conv's channels are [q | k | v]; the rule wants each contiguous.
    split_columns(conv_out_, S, C, {{q0_, KD}, {k0_, KD}, {v_, VD}});
    gdn_l2norm_fwd(q0_, S * l_.k_heads, l_.k_head_dim, kL2Eps, q_);
    gdn_l2norm_fwd(k0_, S * l_.k_heads, l_.k_head_dim, kL2Eps, k_);
    gdn_gates_fwd(a_, b_, alog_, dt_, S, NV, g_, beta_);
    // The recurrent state at every chunk start, kept for the backward (chunks restart at segment starts).
    states_.resize(size_t(gdn_rule_num_chunks(shape_, sg.seg) * l_.v_heads * l_.k_head_dim * l_.v_head_dim));
    gdn_rule_chunked_fwd(shape_, q_, k_, v_, g_, beta_, sg.seg, o_, states_.data());
    gdn_gated_rmsnorm_fwd(o_, z_, norm_, S * NV, l_.v_head_dim, float(c_.rms_eps), y_);
    linear_fwd(y_, wout_, nullptr, S, VD, H, out);
  }

  void prefill(const SampleGeo& sg, const float* h, float* out, MixerCache& cache, int64_t) override {
    forward(sg, h, out);
    const int64_t S = S_, C = l_.conv_dim(), K = l_.conv_kernel;
    // Conv window: the last K-1 inputs of every channel, oldest first (zeros before the prompt).
    cache.conv.assign(size_t(C * (K - 1)), 0.0f);
    for (int64_t j = 0; j < K - 1; ++j) {
      const int64_t t = S - (K - 1) + j;
      if (t >= 0)
        for (int64_t ch = 0; ch < C; ++ch) cache.conv[size_t(ch * (K - 1) + j)] = qkv_[t * C + ch];
    }
    // Recurrent state after the prompt: the last chunk's start state, advanced over that chunk's rows.
    const int64_t per = l_.v_heads * l_.k_head_dim * l_.v_head_dim, n_chunks = gdn_rule_num_chunks(shape_, nullptr);
    cache.state.assign(states_.begin() + (n_chunks - 1) * per, states_.begin() + n_chunks * per);
    std::vector<float> o_t(size_t(l_.value_dim()));
    for (int64_t t = (n_chunks - 1) * kDeltaRuleChunk; t < S; ++t)
      gdn_rule_step(q_ + t * l_.key_dim(), k_ + t * l_.key_dim(), v_ + t * l_.value_dim(), g_ + t * l_.v_heads,
                    beta_ + t * l_.v_heads, l_.k_heads, l_.v_heads, l_.k_head_dim, l_.v_head_dim, cache.state.data(),
                    o_t.data());
    cache.len = S;
  }

  void backward(const SampleGeo& sg, const float* h, const float* dout, float* dh) override {
    const int64_t S = S_, H = c_.hidden, C = l_.conv_dim(), KD = l_.key_dim(), VD = l_.value_dim();
    const int64_t NV = l_.v_heads;
    linear_bwd(y_, wout_, dout, S, VD, H, dy_, dwout_, nullptr);
    gdn_gated_rmsnorm_bwd(o_, z_, norm_, dy_, S * NV, l_.v_head_dim, float(c_.rms_eps), do_, dz_, dnorm_);
    gdn_rule_chunked_bwd(shape_, q_, k_, v_, g_, beta_, sg.seg, states_.data(), do_, dq_, dk_, dv_, dg_, dbeta_);
    gdn_gates_bwd(a_, b_, alog_, dt_, dg_, dbeta_, S, NV, da_, db_, dalog_, ddt_);
    gdn_l2norm_bwd(q0_, dq_, S * l_.k_heads, l_.k_head_dim, kL2Eps, dq0_);
    gdn_l2norm_bwd(k0_, dk_, S * l_.k_heads, l_.k_head_dim, kL2Eps, dk0_);
    join_columns(dconv_out_, S, C, {{dq0_, KD}, {dk0_, KD}, {dv_, VD}});
    gdn_conv_silu_bwd(qkv_, conv_, dconv_out_, S, C, l_.conv_kernel, sg.seg, dqkv_, dconv_);
    if (fused_) {
      const int64_t P = C + VD + 2 * NV;
      join_columns(dproj_, S, P, {{dqkv_, C}, {dz_, VD}, {db_, NV}, {da_, NV}});
      linear_bwd(h, wqkv_, dproj_, S, H, P, dh, dwqkv_, nullptr);
      return;
    }
    linear_bwd(h, wqkv_, dqkv_, S, H, C, dh, dwqkv_, nullptr);
    linear_bwd(h, wz_, dz_, S, H, VD, dh, dwz_, nullptr, true);
    linear_bwd(h, wb_, db_, S, H, NV, dh, dwb_, nullptr, true);
    linear_bwd(h, wa_, da_, S, H, NV, dh, dwa_, nullptr, true);
  }

 private:
  struct Part {
    float* p;
    int64_t width;
  };
  static void split_columns(const float* src, int64_t S, int64_t C, std::initializer_list<Part> parts) {
    for (int64_t t = 0; t < S; ++t) {
      int64_t off = 0;
      for (const Part& q : parts) {
        std::memcpy(q.p + t * q.width, src + t * C + off, sizeof(float) * size_t(q.width));
        off += q.width;
      }
    }
  }
  static void join_columns(float* dst, int64_t S, int64_t C, std::initializer_list<Part> parts) {
    for (int64_t t = 0; t < S; ++t) {
      int64_t off = 0;
      for (const Part& q : parts) {
        std::memcpy(dst + t * C + off, q.p + t * q.width, sizeof(float) * size_t(q.width));
        off += q.width;
      }
    }
  }

  const ModelConfig& c_;
  const LinearAttnConfig& l_;
  int64_t S_;
  GdnShape shape_;
  const float *wqkv_, *wz_, *wb_, *wa_, *conv_, *dt_, *alog_, *norm_, *wout_;
  float *dwqkv_, *dwz_, *dwb_, *dwa_, *dconv_, *ddt_, *dalog_, *dnorm_, *dwout_;
  bool fused_ = false;
  float *proj_ = nullptr, *dproj_ = nullptr;
  float *qkv_, *conv_out_, *z_, *b_, *a_, *q0_, *k0_, *q_, *k_, *v_, *g_, *beta_, *o_, *y_;
  std::vector<float> states_;
  float *dy_ = nullptr, *do_ = nullptr, *dz_ = nullptr, *dq_ = nullptr, *dk_ = nullptr, *dq0_ = nullptr,
        *dk0_ = nullptr, *dv_ = nullptr, *dg_ = nullptr, *dbeta_ = nullptr, *da_ = nullptr, *db_ = nullptr,
        *dconv_out_ = nullptr, *dqkv_ = nullptr;
};

}  // namespace

void deltanet_decode_step(const ModelConfig& c, const UnitLayout& lay, const float* w, const float* h, int64_t n,
                          float* out, MixerCache* const* caches) {
  const auto& l = c.linear;
  const int64_t H = c.hidden, C = l.conv_dim(), KD = l.key_dim(), VD = l.value_dim(), NV = l.v_heads;
  auto at = [&](const char* s) { return w + lay.find(s).offset; };
  auto vec = [](int64_t m) { return std::vector<float>(static_cast<size_t>(m)); };
  auto qkv = vec(n * C), conv = vec(C), z = vec(n * VD), b = vec(n * NV), a = vec(n * NV), q = vec(KD), k = vec(KD),
       g = vec(n * NV), beta = vec(n * NV), o = vec(n * VD), y = vec(n * VD);
  linear_fwd(h, at("linear_attn.in_proj_qkv.weight"), nullptr, n, H, C, qkv.data());
  linear_fwd(h, at("linear_attn.in_proj_z.weight"), nullptr, n, H, VD, z.data());
  linear_fwd(h, at("linear_attn.in_proj_b.weight"), nullptr, n, H, NV, b.data());
  linear_fwd(h, at("linear_attn.in_proj_a.weight"), nullptr, n, H, NV, a.data());
  gdn_gates_fwd(a.data(), b.data(), at("linear_attn.A_log"), at("linear_attn.dt_bias"), n, NV, g.data(), beta.data());
  for (int64_t r = 0; r < n; ++r) {
    MixerCache& mc = *caches[r];
    if (mc.state.empty()) {  // a sequence that starts here
      mc.conv.assign(size_t(C * (l.conv_kernel - 1)), 0.0f);
      mc.state.assign(size_t(NV * l.k_head_dim * l.v_head_dim), 0.0f);
    }
    gdn_conv_silu_step(&qkv[size_t(r * C)], at("linear_attn.conv1d.weight"), C, l.conv_kernel, mc.conv.data(),
                       conv.data());
    gdn_l2norm_fwd(conv.data(), l.k_heads, l.k_head_dim, kL2Eps, q.data());
    gdn_l2norm_fwd(conv.data() + KD, l.k_heads, l.k_head_dim, kL2Eps, k.data());
    gdn_rule_step(q.data(), k.data(), conv.data() + 2 * KD, &g[size_t(r * NV)], &beta[size_t(r * NV)], l.k_heads, NV,
                  l.k_head_dim, l.v_head_dim, mc.state.data(), &o[size_t(r * VD)]);
    mc.len += 1;
  }
  gdn_gated_rmsnorm_fwd(o.data(), z.data(), at("linear_attn.norm.weight"), n * NV, l.v_head_dim, float(c.rms_eps),
                        y.data());
  linear_fwd(y.data(), at("linear_attn.out_proj.weight"), nullptr, n, VD, H, out);
}

std::unique_ptr<MixerRef> make_deltanet_ref(const ModelConfig& c, const UnitLayout& lay, const float* w, float* dw,
                                            int64_t S) {
  return std::make_unique<DeltaNetRef>(c, lay, w, dw, S);
}

}  // namespace lt::cpu
