// Decoder layer forward/backward (reference.h), one sample at a time so that every reduction across
// samples happens in sample order whatever the caller's grouping of samples.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "backend/cpu/ops.h"
#include "backend/cpu/reference.h"
#include "backend/cpu/scratch.h"
#include "core/error.h"

namespace lt::cpu {

namespace {

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

// Internals of one sample's forward, kept for the backward; carved from a reusable arena.
struct SampleWork {
  int64_t S, H, Q, KV, F, heads;
  float *h, *qpre = nullptr, *kpre = nullptr, *q, *k, *v, *a, *lse, *x1, *h2, *gate, *up, *act;
  static constexpr int kTakes = 13;
  static int64_t floats(const ModelConfig& c, int64_t S) {
    const int64_t H = c.hidden, Q = c.q_dim(), KV = c.kv_dim(), F = c.ffn;
    return S * (4 * H + 2 * Q + 3 * KV + 3 * F + c.heads) + (c.qk_norm ? S * (Q + KV) : 0);
  }
  SampleWork(const ModelConfig& c, int64_t S_, Scratch& sc)
      : S(S_), H(c.hidden), Q(c.q_dim()), KV(c.kv_dim()), F(c.ffn), heads(c.heads) {
    h = sc.take(S * H);
    if (c.qk_norm) {
      qpre = sc.take(S * Q);
      kpre = sc.take(S * KV);
    }
    q = sc.take(S * Q);
    k = sc.take(S * KV);
    v = sc.take(S * KV);
    a = sc.take(S * Q);
    lse = sc.take(c.heads * S);
    x1 = sc.take(S * H);
    h2 = sc.take(S * H);
    gate = sc.take(S * F);
    up = sc.take(S * F);
    act = sc.take(S * F);
  }
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

// Forward of one sample; y [S,H] (skipped when y == nullptr: the backward's recompute needs only the
// internals, not the down projection's output). Fills every internal of w.
void sample_forward(const ModelConfig& c, const LayerWeights& W, const float* inv_freq, const SampleGeo& sg,
                    const float* x, float* y, SampleWork& w) {
  const int64_t S = w.S, H = w.H, Q = w.Q, KV = w.KV, F = w.F;
  const float eps = float(c.rms_eps);
  rmsnorm_fwd(x, W.ln1, S, H, eps, w.h);
  float* qdst = c.qk_norm ? w.qpre : w.q;
  float* kdst = c.qk_norm ? w.kpre : w.k;
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
  if (!y) return;
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
  Scratch& sc = Scratch::get(0);
  sc.reset(SampleWork::floats(c, g.seq), SampleWork::kTakes);
  SampleWork w(c, g.seq, sc);
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
  Scratch& sc = Scratch::get(0);
  sc.reset(SampleWork::floats(c, S) + S * (3 * H + 3 * F + 2 * Q + 2 * KV), SampleWork::kTakes + 10);
  SampleWork w(c, S, sc);
  float *dact = sc.take(S * F), *dgate = sc.take(S * F), *dup = sc.take(S * F),
        *dh2 = sc.take(S * H), *dx1 = sc.take(S * H), *da = sc.take(S * Q), *dq = sc.take(S * Q), *dk = sc.take(S * KV),
        *dv = sc.take(S * KV), *dh = sc.take(S * H);
  for (int64_t b = 0; b < g.batch; ++b) {
    const SampleGeo sg = sample_geo(g, b, iota);
    const float* xb = x + b * S * H;
    const float* dyb = dy + b * S * H;
    float* dxb = dx + b * S * H;
    sample_forward(c, W, inv_freq.data(), sg, xb, nullptr, w);  // recompute internals
    // MLP: y = x1 + down(silu(gate) * up)
    linear_bwd(w.act, W.wd, dyb, S, F, H, dact, D.wd, nullptr);
    swiglu_bwd(w.gate, w.up, dact, S, F, dgate, dup);
    linear_bwd(w.h2, W.wg, dgate, S, H, F, dh2, D.wg, nullptr);
    linear_bwd(w.h2, W.wu, dup, S, H, F, dh2, D.wu, nullptr, /*accumulate_dx=*/true);
    std::memcpy(dx1, dyb, sizeof(float) * size_t(S * H));
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
    std::memcpy(dxb, dx1, sizeof(float) * size_t(S * H));
    rmsnorm_bwd(xb, W.ln1, dh, S, H, eps, dxb, D.ln1, /*accumulate_dx=*/true);
  }
}

}  // namespace lt::cpu
