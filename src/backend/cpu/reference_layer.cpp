// Decoder layer forward/backward (reference.h), one sample at a time so that every reduction across
// samples happens in sample order whatever the caller's grouping of samples. What every layer kind
// shares lives here (two RMSNorms, residuals, SwiGLU MLP); the token mixer is the kind's (mixer_ref.h).
#include <cstring>
#include <memory>
#include <numeric>

#include "backend/cpu/mixer_ref.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/reference.h"
#include "backend/cpu/scratch.h"
#include "core/error.h"

namespace lt::cpu {

namespace {

// The parts of a layer outside its mixer.
struct CommonWeights {
  const float *ln1, *ln2, *wg, *wu, *wd;
};
struct CommonGrads {
  float *ln1, *ln2, *wg, *wu, *wd;
};

template <typename P, typename T>
P bind_common(const UnitLayout& lay, T* base) {
  LT_CHECK(lay.kind == UnitKind::Layer, "layer op called with a non-layer unit layout");
  auto at = [&](const char* s) { return base + lay.find(s).offset; };
  return P{at("input_layernorm.weight"), at("post_attention_layernorm.weight"), at("mlp.gate_proj.weight"),
           at("mlp.up_proj.weight"), at("mlp.down_proj.weight")};
}

// Internals of one sample's forward outside the mixer, carved from a reusable arena.
struct SampleWork {
  float *h, *mix, *x1, *h2, *gate, *up, *act;
  static constexpr int kTakes = 7;
  static int64_t floats(const ModelConfig& c, int64_t S) { return S * (4 * c.hidden + 3 * c.ffn); }
  SampleWork(const ModelConfig& c, int64_t S, Scratch& sc) {
    const int64_t H = c.hidden, F = c.ffn;
    h = sc.take(S * H), mix = sc.take(S * H), x1 = sc.take(S * H), h2 = sc.take(S * H);
    gate = sc.take(S * F), up = sc.take(S * F), act = sc.take(S * F);
  }
};

// The layer's two norm scales: the stored weights, or (1 + w) for zero-centred norms (Qwen3.5).
struct Norms {
  NormScale ln1, ln2;
  Norms(const ModelConfig& c, const CommonWeights& W)
      : ln1(W.ln1, c.hidden, c.norm_plus_one), ln2(W.ln2, c.hidden, c.norm_plus_one) {}
};

SampleGeo sample_geo(const SeqGeometry& g, int64_t b, const std::vector<int32_t>& iota) {
  return {g.positions ? g.positions + b * g.seq : iota.data(), g.segments ? g.segments + b * g.seq : nullptr};
}

// Forward of one sample; y [S,H] (skipped when y == nullptr: the backward's recompute needs only the
// internals, not the down projection's output). Fills every internal of w and of the mixer.
void sample_forward(const ModelConfig& c, const CommonWeights& W, const Norms& nm, MixerRef& mixer,
                    const SampleGeo& sg, int64_t S, const float* x, float* y, SampleWork& w) {
  const int64_t H = c.hidden, F = c.ffn;
  const float eps = float(c.rms_eps);
  rmsnorm_fwd(x, nm.ln1.get(), S, H, eps, w.h);
  mixer.forward(sg, w.h, w.mix);
  for (int64_t i = 0; i < S * H; ++i) w.x1[i] = w.mix[i] + x[i];
  rmsnorm_fwd(w.x1, nm.ln2.get(), S, H, eps, w.h2);
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
  const auto W = bind_common<CommonWeights>(lay, wbuf);
  const Norms nm(c, W);
  auto mixer = make_mixer_ref(c, lay, wbuf, nullptr, g.seq);
  const auto iota = iota_positions(g.seq);
  Scratch& sc = Scratch::get(0);
  sc.reset(SampleWork::floats(c, g.seq), SampleWork::kTakes);
  SampleWork w(c, g.seq, sc);
  const int64_t stride = g.seq * c.hidden;
  for (int64_t b = 0; b < g.batch; ++b)
    sample_forward(c, W, nm, *mixer, sample_geo(g, b, iota), g.seq, x + b * stride, y + b * stride, w);
}

void layer_backward(const ModelConfig& c, const UnitLayout& lay, const float* wbuf, const SeqGeometry& g,
                    const float* x, const float* dy, float* dx, float* dwbuf) {
  check_geometry(g);
  const auto W = bind_common<CommonWeights>(lay, wbuf);
  const auto D = bind_common<CommonGrads>(lay, dwbuf);
  const Norms nm(c, W);
  auto mixer = make_mixer_ref(c, lay, wbuf, dwbuf, g.seq);
  const auto iota = iota_positions(g.seq);
  const int64_t S = g.seq, H = c.hidden, F = c.ffn;
  const float eps = float(c.rms_eps);
  Scratch& sc = Scratch::get(0);
  sc.reset(SampleWork::floats(c, S) + S * (3 * H + 3 * F), SampleWork::kTakes + 6);
  SampleWork w(c, S, sc);
  float *dact = sc.take(S * F), *dgate = sc.take(S * F), *dup = sc.take(S * F), *dh2 = sc.take(S * H),
        *dx1 = sc.take(S * H), *dh = sc.take(S * H);
  for (int64_t b = 0; b < g.batch; ++b) {
    const SampleGeo sg = sample_geo(g, b, iota);
    const float* xb = x + b * S * H;
    const float* dyb = dy + b * S * H;
    float* dxb = dx + b * S * H;
    sample_forward(c, W, nm, *mixer, sg, S, xb, nullptr, w);  // recompute internals
    // MLP: y = x1 + down(silu(gate) * up)
    linear_bwd(w.act, W.wd, dyb, S, F, H, dact, D.wd, nullptr);
    swiglu_bwd(w.gate, w.up, dact, S, F, dgate, dup);
    linear_bwd(w.h2, W.wg, dgate, S, H, F, dh2, D.wg, nullptr);
    linear_bwd(w.h2, W.wu, dup, S, H, F, dh2, D.wu, nullptr, /*accumulate_dx=*/true);
    std::memcpy(dx1, dyb, sizeof(float) * size_t(S * H));
    rmsnorm_bwd(w.x1, nm.ln2.get(), dh2, S, H, eps, dx1, D.ln2, /*accumulate_dx=*/true);
    // Mixer: x1 = x + mixer(RMSNorm(x))
    mixer->backward(sg, w.h, dx1, dh);
    std::memcpy(dxb, dx1, sizeof(float) * size_t(S * H));
    rmsnorm_bwd(xb, nm.ln1.get(), dh, S, H, eps, dxb, D.ln1, /*accumulate_dx=*/true);
  }
}

}  // namespace lt::cpu
