// Decoder layer forward/backward (reference.h), one sample at a time so that every reduction across
// samples happens in sample order whatever the caller's grouping of samples.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "backend/cpu/ops.h"
#include "backend/cpu/reference.h"
#include "core/error.h"

namespace lt::cpu {

namespace {

// Uninitialised float scratch (large buffers; zero-filling them would cost real time).
struct Buf {
  std::unique_ptr<float[]> p;
  explicit Buf(int64_t n) : p(std::make_unique_for_overwrite<float[]>(size_t(std::max<int64_t>(n, 1)))) {}
  float* get() const { return p.get(); }
  operator float*() const { return p.get(); }
};

struct LayerWeights {
  const float *ln1, *wq, *bq = nullptr, *wk, *bk = nullptr, *wv, *bv = nullptr, *qn = nullptr, *kn = nullptr, *wo,
                                             *ln2, *wg, *wu, *wd;
};
struct LayerGrads {
  float *ln1, *wq, *bq = nullptr, *wk, *bk = nullptr, *wv, *bv = nullptr, *qn = nullptr, *kn = nullptr, *wo, *ln2,
                                       *wg, *wu, *wd;
};

template <typename P, typename T>
P bind(const ModelConfig& c, const UnitLayout& lay, T* base) {
  LT_CHECK(lay.kind == UnitKind::Layer, "layer op called with a non-layer unit layout");
  auto at = [&](const char* s) { return base + lay.find(s).offset; };
  P w;
  w.ln1 = at("input_layernorm.weight");
  w.wq = at("self_attn.q_proj.weight");
  w.wk = at("self_attn.k_proj.weight");
  w.wv = at("self_attn.v_proj.weight");
  if (c.attn_bias) {
    w.bq = at("self_attn.q_proj.bias");
    w.bk = at("self_attn.k_proj.bias");
    w.bv = at("self_attn.v_proj.bias");
  }
  if (c.qk_norm) {
    w.qn = at("self_attn.q_norm.weight");
    w.kn = at("self_attn.k_norm.weight");
  }
  w.wo = at("self_attn.o_proj.weight");
  w.ln2 = at("post_attention_layernorm.weight");
  w.wg = at("mlp.gate_proj.weight");
  w.wu = at("mlp.up_proj.weight");
  w.wd = at("mlp.down_proj.weight");
  return w;
}

// Internals of one sample's forward, kept for the backward.
struct SampleWork {
  int64_t S, H, Q, KV, F, heads;
  Buf h, qpre, kpre, q, k, v, a, lse, x1, h2, gate, up, act;
  SampleWork(const ModelConfig& c, int64_t S_)
      : S(S_), H(c.hidden), Q(c.q_dim()), KV(c.kv_dim()), F(c.ffn), heads(c.heads),
        h(S * H), qpre(c.qk_norm ? S * Q : 0), kpre(c.qk_norm ? S * KV : 0), q(S * Q), k(S * KV), v(S * KV),
        a(S * Q), lse(c.heads * S), x1(S * H), h2(S * H), gate(S * F), up(S * F), act(S * F) {}
};

AttnShape attn_shape(const ModelConfig& c, int64_t S) {
  AttnShape s;
  s.seq = S;
  s.heads = c.heads;
  s.kv_heads = c.kv_heads;
  s.head_dim = c.head_dim;
  s.scale = float(1.0 / std::sqrt(double(c.head_dim)));
  return s;
}

struct SampleGeo {
  const int32_t* pos;
  const int32_t* seg;
};

SampleGeo sample_geo(const SeqGeometry& g, int64_t b, const std::vector<int32_t>& iota) {
  return {g.positions ? g.positions + b * g.seq : iota.data(), g.segments ? g.segments + b * g.seq : nullptr};
}

// Forward of one sample; y [S,H]. Fills every internal of w.
void sample_forward(const ModelConfig& c, const LayerWeights& W, const float* inv_freq, const SampleGeo& sg,
                    const float* x, float* y, SampleWork& w) {
  const int64_t S = w.S, H = w.H, Q = w.Q, KV = w.KV, F = w.F;
  const float eps = float(c.rms_eps);
  rmsnorm_fwd(x, W.ln1, S, H, eps, w.h);
  float* qdst = c.qk_norm ? w.qpre.get() : w.q.get();
  float* kdst = c.qk_norm ? w.kpre.get() : w.k.get();
  linear_fwd(w.h, W.wq, W.bq, S, H, Q, qdst);
  linear_fwd(w.h, W.wk, W.bk, S, H, KV, kdst);
  linear_fwd(w.h, W.wv, W.bv, S, H, KV, w.v);
  if (c.qk_norm) {
    qk_norm_fwd(w.qpre, W.qn, S, c.heads, c.head_dim, eps, w.q);
    qk_norm_fwd(w.kpre, W.kn, S, c.kv_heads, c.head_dim, eps, w.k);
  }
  rope_fwd(w.q, S, c.heads, c.head_dim, sg.pos, inv_freq);
  rope_fwd(w.k, S, c.kv_heads, c.head_dim, sg.pos, inv_freq);
  attention_fwd(attn_shape(c, S), w.q, w.k, w.v, sg.seg, w.a, w.lse);
  linear_fwd(w.a, W.wo, nullptr, S, Q, H, w.x1);
  for (int64_t i = 0; i < S * H; ++i) w.x1[i] += x[i];
  rmsnorm_fwd(w.x1, W.ln2, S, H, eps, w.h2);
  linear_fwd(w.h2, W.wg, nullptr, S, H, F, w.gate);
  linear_fwd(w.h2, W.wu, nullptr, S, H, F, w.up);
  swiglu_fwd(w.gate, w.up, S, F, w.act);
  linear_fwd(w.act, W.wd, nullptr, S, F, H, y);
  for (int64_t i = 0; i < S * H; ++i) y[i] += w.x1[i];
}

void check_geometry(const SeqGeometry& g) {
  LT_CHECK(g.batch >= 0 && g.seq >= 0, "SeqGeometry: negative batch {} or seq {}", g.batch, g.seq);
}

std::vector<int32_t> iota_positions(int64_t S) {
  std::vector<int32_t> p(static_cast<size_t>(S));
  std::iota(p.begin(), p.end(), 0);
  return p;
}

}  // namespace

void layer_forward(const ModelConfig& c, const UnitLayout& lay, const float* wbuf, const SeqGeometry& g,
                   const float* x, float* y) {
  check_geometry(g);
  const auto W = bind<LayerWeights>(c, lay, wbuf);
  const auto inv_freq = rope_inv_freq(c);
  const auto iota = iota_positions(g.seq);
  SampleWork w(c, g.seq);
  const int64_t stride = g.seq * c.hidden;
  for (int64_t b = 0; b < g.batch; ++b)
    sample_forward(c, W, inv_freq.data(), sample_geo(g, b, iota), x + b * stride, y + b * stride, w);
}

void layer_backward(const ModelConfig& c, const UnitLayout& lay, const float* wbuf, const SeqGeometry& g,
                    const float* x, const float* dy, float* dx, float* dwbuf) {
  check_geometry(g);
  const auto W = bind<LayerWeights>(c, lay, wbuf);
  const auto D = bind<LayerGrads>(c, lay, dwbuf);
  const auto inv_freq = rope_inv_freq(c);
  const auto iota = iota_positions(g.seq);
  const int64_t S = g.seq, H = c.hidden, Q = c.q_dim(), KV = c.kv_dim(), F = c.ffn;
  const float eps = float(c.rms_eps);
  SampleWork w(c, S);
  Buf y(S * H), dact(S * F), dgate(S * F), dup(S * F), dh2(S * H), dx1(S * H), da(S * Q), dq(S * Q), dk(S * KV),
      dv(S * KV), dh(S * H);
  for (int64_t b = 0; b < g.batch; ++b) {
    const SampleGeo sg = sample_geo(g, b, iota);
    const float* xb = x + b * S * H;
    const float* dyb = dy + b * S * H;
    float* dxb = dx + b * S * H;
    sample_forward(c, W, inv_freq.data(), sg, xb, y, w);  // recompute internals
    // MLP: y = x1 + down(silu(gate) * up)
    linear_bwd(w.act, W.wd, dyb, S, F, H, dact, D.wd, nullptr);
    swiglu_bwd(w.gate, w.up, dact, S, F, dgate, dup);
    linear_bwd(w.h2, W.wg, dgate, S, H, F, dh2, D.wg, nullptr);
    linear_bwd(w.h2, W.wu, dup, S, H, F, dh2, D.wu, nullptr, /*accumulate_dx=*/true);
    std::memcpy(dx1.get(), dyb, sizeof(float) * size_t(S * H));
    rmsnorm_bwd(w.x1, W.ln2, dh2, S, H, eps, dx1, D.ln2, /*accumulate_dx=*/true);
    // Attention: x1 = x + o_proj(attn(rope(q), rope(k), v))
    linear_bwd(w.a, W.wo, dx1, S, Q, H, da, D.wo, nullptr);
    attention_bwd(attn_shape(c, S), w.q, w.k, w.v, sg.seg, w.a, w.lse, da, dq, dk, dv);
    rope_bwd(dq, S, c.heads, c.head_dim, sg.pos, inv_freq.data());
    rope_bwd(dk, S, c.kv_heads, c.head_dim, sg.pos, inv_freq.data());
    if (c.qk_norm) {  // in place: dq/dk become gradients of the pre-norm projections
      qk_norm_bwd(w.qpre, W.qn, dq, S, c.heads, c.head_dim, eps, dq, D.qn);
      qk_norm_bwd(w.kpre, W.kn, dk, S, c.kv_heads, c.head_dim, eps, dk, D.kn);
    }
    linear_bwd(w.h, W.wq, dq, S, H, Q, dh, D.wq, D.bq);
    linear_bwd(w.h, W.wk, dk, S, H, KV, dh, D.wk, D.bk, true);
    linear_bwd(w.h, W.wv, dv, S, H, KV, dh, D.wv, D.bv, true);
    std::memcpy(dxb, dx1.get(), sizeof(float) * size_t(S * H));
    rmsnorm_bwd(xb, W.ln1, dh, S, H, eps, dxb, D.ln1, /*accumulate_dx=*/true);
  }
}

}  // namespace lt::cpu
