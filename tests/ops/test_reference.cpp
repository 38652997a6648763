// Layer, head and whole-model reference (reference.h, reference_model.h): gradients by finite
// differences, bit-exactness under sample chunking, packed sequences, edge cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/reference.h"
#include "backend/cpu/reference_model.h"
#include "grad_check.h"

using namespace lt;
using namespace lt::cpu;
using lt::test::dotd;
using lt::test::randn;

namespace {

ModelConfig tiny(Arch arch, bool tied) {
  ModelConfig c;
  c.name = "tiny";
  c.arch = arch;
  c.hidden = 32;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = arch == Arch::Qwen3 ? 12 : 8;
  c.ffn = 48;
  c.vocab = 37;
  c.tied = tied;
  c.attn_bias = arch == Arch::Qwen2;
  c.qk_norm = arch == Arch::Qwen3;
  c.rms_eps = 1e-6;
  c.rope_theta = 10000;
  if (arch == Arch::Llama) {
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = 4;
    c.rope_scaling.original_max_position_embeddings = 16;
  }
  if (arch == Arch::Qwen3_5) {  // layer 0 Gated DeltaNet, layer 1 gated full attention
    c.head_dim = 16;
    c.qk_norm = true;
    c.attn_output_gate = true;
    c.norm_plus_one = true;
    c.partial_rotary = 0.25;  // rotates 4 of 16
    c.linear = LinearAttnConfig{2, 4, 8, 6, 4};
    c.layer_kinds = {LayerKind::GatedDeltaNet, LayerKind::Attention};
  }
  return c;
}

std::vector<float> random_unit(const UnitLayout& u, uint64_t seed) {
  std::vector<float> w(static_cast<size_t>(u.numel), 0.0f);
  auto r = randn(static_cast<size_t>(u.numel), seed);
  for (auto& p : u.params) {
    const bool norm = p.suffix.find("norm") != std::string::npos;
    for (int64_t i = 0; i < p.numel; ++i)
      w[size_t(p.offset + i)] = norm ? 1.0f + 0.2f * r[size_t(p.offset + i)] : 0.15f * r[size_t(p.offset + i)];
  }
  return w;
}

// Directional finite-difference check of grad restricted to each parameter of the unit.
void expect_unit_grad(const std::function<double()>& f, const UnitLayout& u, std::vector<float>& w,
                      const std::vector<float>& grad, const std::string& what, float h = 1e-2f, double noise = 1e-7) {
  for (auto& p : u.params) {
    auto d = randn(static_cast<size_t>(p.numel), 7 + uint64_t(p.offset));
    double dn = 0, an = 0, gn = 0;
    for (auto v : d) dn += double(v) * v;
    dn = std::sqrt(dn);
    for (int64_t i = 0; i < p.numel; ++i) {
      d[size_t(i)] = float(d[size_t(i)] / dn);
      an += double(grad[size_t(p.offset + i)]) * d[size_t(i)];
      gn += double(grad[size_t(p.offset + i)]) * grad[size_t(p.offset + i)];
    }
    const auto w0 = w;
    for (int64_t i = 0; i < p.numel; ++i) w[size_t(p.offset + i)] = w0[size_t(p.offset + i)] + h * d[size_t(i)];
    const double fp = f();
    for (int64_t i = 0; i < p.numel; ++i) w[size_t(p.offset + i)] = w0[size_t(p.offset + i)] - h * d[size_t(i)];
    const double fm = f();
    w = w0;
    const double fd = (fp - fm) / (2 * h);
    EXPECT_NEAR(fd, an, 2e-3 * std::fabs(an) + 1e-4 * std::sqrt(gn) + noise) << what << ": " << p.name;
  }
}

struct LayerCase {
  ModelConfig c;
  UnitLayout lay;
  SeqGeometry g;
  std::vector<int32_t> pos, seg;
  std::vector<float> w, x;
  LayerCase(Arch arch, int64_t batch, int64_t seq, bool packed, int64_t layer = 0)
      : c(tiny(arch, false)), lay(layer_unit_layout(c, layer)) {
    g.batch = batch;
    g.seq = seq;
    if (packed) {  // each sample: two segments, positions restarting at the boundary
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t s = 0; s < seq; ++s) {
          const int64_t cut = 2 + b % 3;
          seg.push_back(s < cut ? 0 : 1);
          pos.push_back(int32_t(s < cut ? s : s - cut));
        }
      g.positions = pos.data();
      g.segments = seg.data();
    }
    w = random_unit(lay, 100 + uint64_t(arch));
    x = randn(static_cast<size_t>(batch * seq * c.hidden), 200);
  }
};

void layer_gradcheck(Arch arch, bool packed, int64_t layer = 0, int64_t seq = 5) {
  LayerCase t(arch, 2, seq, packed, layer);
  const int64_t n = t.g.tokens() * t.c.hidden;
  auto r = randn(static_cast<size_t>(n), 300);
  auto f = [&] {
    std::vector<float> y(static_cast<size_t>(n));
    layer_forward(t.c, t.lay, t.w.data(), t.g, t.x.data(), y.data());
    return dotd(y, r);
  };
  std::vector<float> dx(static_cast<size_t>(n)), dw(static_cast<size_t>(t.lay.numel), 0.0f);
  layer_backward(t.c, t.lay, t.w.data(), t.g, t.x.data(), r.data(), dx.data(), dw.data());
  lt::test::expect_grad(f, t.x, dx, "layer dx");
  expect_unit_grad(f, t.lay, t.w, dw, "layer dw");
}

}  // namespace

TEST(Reference, LayerGradientsQwen2Bias) { layer_gradcheck(Arch::Qwen2, false); }
TEST(Reference, LayerGradientsQwen3QkNormPacked) { layer_gradcheck(Arch::Qwen3, true); }
TEST(Reference, LayerGradientsLlama3Rope) { layer_gradcheck(Arch::Llama, false); }
// Qwen3.5: the Gated DeltaNet layer (conv, gates, delta rule, gated norm; (1 + w) norms) and the gated
// full-attention layer (output gate, partial RoPE), packed and not; seq 9 covers the conv window.
TEST(Reference, LayerGradientsQwen35DeltaNet) { layer_gradcheck(Arch::Qwen3_5, false, 0, 9); }
TEST(Reference, LayerGradientsQwen35DeltaNetPacked) { layer_gradcheck(Arch::Qwen3_5, true, 0, 9); }
TEST(Reference, LayerGradientsQwen35GatedAttentionPacked) { layer_gradcheck(Arch::Qwen3_5, true, 1, 7); }

TEST(Reference, LayerBackwardBitIdenticalUnderSampleChunking) {
  for (auto [arch, layer] : {std::pair{Arch::Qwen2, 0}, {Arch::Qwen3, 0}, {Arch::Qwen3_5, 0}, {Arch::Qwen3_5, 1}}) {
    LayerCase t(arch, 4, 6, true, layer);
    const int64_t H = t.c.hidden, rows = t.g.seq * H, n = t.g.tokens() * H;
    auto dy = randn(static_cast<size_t>(n), 400);
    const auto dw0 = randn(static_cast<size_t>(t.lay.numel), 401);  // dw accumulates onto existing values
    std::vector<float> y_all(static_cast<size_t>(n)), dx_all(static_cast<size_t>(n)), dw_all = dw0;
    layer_forward(t.c, t.lay, t.w.data(), t.g, t.x.data(), y_all.data());
    layer_backward(t.c, t.lay, t.w.data(), t.g, t.x.data(), dy.data(), dx_all.data(), dw_all.data());
    for (auto split : {std::vector<int64_t>{2, 2}, std::vector<int64_t>{1, 3}, std::vector<int64_t>{1, 1, 1, 1}}) {
      std::vector<float> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n)), dw = dw0;
      int64_t b0 = 0;
      for (int64_t nb : split) {
        SeqGeometry g = t.g;
        g.batch = nb;
        g.positions = t.pos.data() + b0 * t.g.seq;
        g.segments = t.seg.data() + b0 * t.g.seq;
        layer_forward(t.c, t.lay, t.w.data(), g, t.x.data() + b0 * rows, y.data() + b0 * rows);
        layer_backward(t.c, t.lay, t.w.data(), g, t.x.data() + b0 * rows, dy.data() + b0 * rows, dx.data() + b0 * rows,
                       dw.data());
        b0 += nb;
      }
      EXPECT_EQ(std::memcmp(y.data(), y_all.data(), sizeof(float) * y.size()), 0) << "forward differs";
      EXPECT_EQ(std::memcmp(dx.data(), dx_all.data(), sizeof(float) * dx.size()), 0) << "dx differs";
      EXPECT_EQ(std::memcmp(dw.data(), dw_all.data(), sizeof(float) * dw.size()), 0) << "dw differs";
    }
  }
}

namespace {
void packed_equals_separate(Arch arch, int64_t layer) {
  // One row holding sequences of 4 and 6 tokens (segment mask, positions restart) == each alone.
  LayerCase t(arch, 1, 10, false, layer);
  const int64_t H = t.c.hidden;
  std::vector<int32_t> seg = {5, 5, 5, 5, 8, 8, 8, 8, 8, 8}, pos = {0, 1, 2, 3, 0, 1, 2, 3, 4, 5};
  SeqGeometry packed = t.g;
  packed.segments = seg.data();
  packed.positions = pos.data();
  auto dy = randn(static_cast<size_t>(10 * H), 500);
  std::vector<float> y(static_cast<size_t>(10 * H)), dx(static_cast<size_t>(10 * H)), dw(static_cast<size_t>(t.lay.numel), 0.0f);
  layer_forward(t.c, t.lay, t.w.data(), packed, t.x.data(), y.data());
  layer_backward(t.c, t.lay, t.w.data(), packed, t.x.data(), dy.data(), dx.data(), dw.data());
  std::vector<float> ys(static_cast<size_t>(10 * H)), dxs(static_cast<size_t>(10 * H)), dws(static_cast<size_t>(t.lay.numel), 0.0f);
  for (auto [r0, len] : {std::pair<int64_t, int64_t>{0, 4}, {4, 6}}) {
    SeqGeometry g;
    g.batch = 1;
    g.seq = len;
    layer_forward(t.c, t.lay, t.w.data(), g, t.x.data() + r0 * H, ys.data() + r0 * H);
    layer_backward(t.c, t.lay, t.w.data(), g, t.x.data() + r0 * H, dy.data() + r0 * H, dxs.data() + r0 * H, dws.data());
  }
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_NEAR(y[i], ys[i], 1e-5 * (1 + std::fabs(ys[i])));
    EXPECT_NEAR(dx[i], dxs[i], 1e-5 * (1 + std::fabs(dxs[i])));
  }
  // Weight gradients sum over rows: fp32 rounding of long sums with cancellation, hence the looser bound.
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw[i], dws[i], 4e-5 * (1 + std::fabs(dws[i])));
}
}  // namespace

TEST(Reference, LayerPackedSequencesEqualSeparateRuns) { packed_equals_separate(Arch::Qwen3, 0); }
// Gated DeltaNet: neither the conv window nor the recurrent state crosses a segment start.
TEST(Reference, DeltaNetPackedSequencesEqualSeparateRuns) { packed_equals_separate(Arch::Qwen3_5, 0); }
TEST(Reference, GatedAttentionPackedSequencesEqualSeparateRuns) { packed_equals_separate(Arch::Qwen3_5, 1); }

namespace {
struct HeadCase {
  ModelConfig c = tiny(Arch::Qwen2, false);
  UnitLayout lay = head_unit_layout(c);
  std::vector<float> hw = random_unit(lay, 600);
  float* lm() { return hw.data() + lay.find("lm_head.weight").offset; }
};
}  // namespace

TEST(Reference, HeadGradients) {
  HeadCase t;
  const int64_t T = 6, H = t.c.hidden;
  auto x = randn(static_cast<size_t>(T * H), 601);
  const std::vector<int32_t> tg = {3, -100, 36, 0, 7, 7};
  const float scale = 1.0f / 5;
  auto f = [&] {
    return head_forward_backward(t.c, t.lay, t.hw.data(), t.lm(), tg.data(), T, x.data(), scale, nullptr, nullptr,
                                 nullptr)
               .loss_sum *
           scale;
  };
  std::vector<float> dx(static_cast<size_t>(T * H)), dhw(static_cast<size_t>(t.lay.numel), 0.0f);
  float* dlm = dhw.data() + t.lay.find("lm_head.weight").offset;
  HeadResult r = head_forward_backward(t.c, t.lay, t.hw.data(), t.lm(), tg.data(), T, x.data(), scale, dx.data(),
                                       dhw.data(), dlm);
  EXPECT_EQ(r.n_tokens, 5);
  lt::test::expect_grad(f, x, dx, "head dx");
  expect_unit_grad(f, t.lay, t.hw, dhw, "head dw");
  for (int64_t i = 0; i < H; ++i) EXPECT_EQ(dx[size_t(1 * H + i)], 0.0f);  // ignored row: no gradient
}

TEST(Reference, HeadAllIgnoredAndSingleToken) {
  HeadCase t;
  const int64_t H = t.c.hidden;
  auto x = randn(static_cast<size_t>(3 * H), 610);
  const std::vector<int32_t> none = {-100, -100, -100};
  std::vector<float> dx(static_cast<size_t>(3 * H), 1.0f), dhw(static_cast<size_t>(t.lay.numel), 0.0f);
  float* dlm = dhw.data() + t.lay.find("lm_head.weight").offset;
  HeadResult r = head_forward_backward(t.c, t.lay, t.hw.data(), t.lm(), none.data(), 3, x.data(), 1.0f, dx.data(),
                                       dhw.data(), dlm);
  EXPECT_EQ(r.n_tokens, 0);
  EXPECT_EQ(r.loss_sum, 0.0);
  for (auto v : dx) EXPECT_EQ(v, 0.0f);
  for (auto v : dhw) EXPECT_EQ(v, 0.0f);

  // One token: loss = logsumexp(logits) - logits[target], logits from head_logits.
  const int32_t tg = 11;
  r = head_forward_backward(t.c, t.lay, t.hw.data(), t.lm(), &tg, 1, x.data(), 1.0f, nullptr, nullptr, nullptr);
  std::vector<float> logits(static_cast<size_t>(t.c.vocab));
  const int64_t row = 0;
  head_logits(t.c, t.lay, t.hw.data(), t.lm(), x.data(), &row, 1, logits.data());
  double s = 0;
  for (auto z : logits) s += std::exp(double(z));
  EXPECT_EQ(r.n_tokens, 1);
  EXPECT_NEAR(r.loss_sum, std::log(s) - logits[tg], 1e-5);
}

TEST(Reference, HeadBitIdenticalUnderSampleChunking) {
  HeadCase t;
  set_head_chunk_rows(5);  // at most 5 rows: each 7-row sample is split 4 + 3 (not 5 + 2)
  const int64_t B = 3, S = 7, H = t.c.hidden, T = B * S;
  auto x = randn(static_cast<size_t>(T * H), 620);
  std::vector<int32_t> tg(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) tg[size_t(i)] = i % 5 == 0 ? -100 : int32_t((i * 7) % t.c.vocab);
  const size_t lm_off = size_t(t.lay.find("lm_head.weight").offset);
  const auto d0 = randn(static_cast<size_t>(t.lay.numel), 621);
  std::vector<float> dx_all(static_cast<size_t>(T * H)), dhw_all = d0;
  HeadResult all = head_forward_backward(t.c, t.lay, t.hw.data(), t.lm(), tg.data(), T, x.data(), 0.1f, dx_all.data(),
                                         dhw_all.data(), dhw_all.data() + lm_off, S);
  std::vector<float> dx(static_cast<size_t>(T * H)), dhw = d0;
  double loss = 0;
  for (auto [b0, nb] : {std::pair<int64_t, int64_t>{0, 2}, {2, 1}}) {
    HeadResult r = head_forward_backward(t.c, t.lay, t.hw.data(), t.lm(), tg.data() + b0 * S, nb * S,
                                         x.data() + b0 * S * H, 0.1f, dx.data() + b0 * S * H, dhw.data(),
                                         dhw.data() + lm_off, S);
    loss += r.loss_sum;
  }
  EXPECT_EQ(std::memcmp(dx.data(), dx_all.data(), sizeof(float) * dx.size()), 0);
  EXPECT_EQ(std::memcmp(dhw.data(), dhw_all.data(), sizeof(float) * dhw.size()), 0);
  EXPECT_NEAR(loss, all.loss_sum, 1e-12 * all.loss_sum);
  // One call per sample without seq (what the CPU backend does) gives the same bits too.
  std::vector<float> dx_s(static_cast<size_t>(T * H)), dhw_s = d0;
  for (int64_t b = 0; b < B; ++b)
    head_forward_backward(t.c, t.lay, t.hw.data(), t.lm(), tg.data() + b * S, S, x.data() + b * S * H, 0.1f,
                          dx_s.data() + b * S * H, dhw_s.data(), dhw_s.data() + lm_off);
  EXPECT_EQ(std::memcmp(dx_s.data(), dx_all.data(), sizeof(float) * dx_s.size()), 0);
  EXPECT_EQ(std::memcmp(dhw_s.data(), dhw_all.data(), sizeof(float) * dhw_s.size()), 0);
  // Chunking only changes rounding: one big chunk agrees closely.
  set_head_chunk_rows(1000);
  std::vector<float> dx1(static_cast<size_t>(T * H)), dhw1 = d0;
  HeadResult one = head_forward_backward(t.c, t.lay, t.hw.data(), t.lm(), tg.data(), T, x.data(), 0.1f, dx1.data(),
                                         dhw1.data(), dhw1.data() + lm_off);
  set_head_chunk_rows(0);
  EXPECT_NEAR(one.loss_sum, all.loss_sum, 1e-7 * all.loss_sum);  // fp32 logits rounding
  for (size_t i = 0; i < dhw1.size(); ++i) EXPECT_NEAR(dhw1[i], dhw_all[i], 1e-6 * (1 + std::fabs(dhw_all[i])));
}

TEST(Reference, ShiftLabelsRespectsSamplesAndSegments) {
  SeqGeometry g;
  g.batch = 2;
  g.seq = 4;
  const std::vector<int32_t> labels = {10, 11, -100, 13, 20, 21, 22, 23};
  const std::vector<int32_t> seg = {0, 0, 0, 0, 1, 1, 2, 2};
  std::vector<int32_t> tg(8);
  shift_labels(labels.data(), g, tg.data());
  EXPECT_EQ(tg, (std::vector<int32_t>{11, -100, 13, -100, 21, 22, 23, -100}));
  g.segments = seg.data();
  shift_labels(labels.data(), g, tg.data());
  EXPECT_EQ(tg, (std::vector<int32_t>{11, -100, 13, -100, 21, -100, 23, -100}));
}

TEST(Reference, ModelGradientsTiedByFiniteDifferences) {
  const ModelConfig c = tiny(Arch::Qwen2, true);
  const ModelLayout lay = model_layout(c);
  UnitBuffers w(lay);
  for (size_t u = 0; u < lay.units.size(); ++u) w.units[u] = random_unit(lay.units[u], 700 + u);
  SeqGeometry g;
  g.batch = 2;
  g.seq = 5;
  std::vector<int32_t> ids = {1, 5, 9, 36, 2, 0, 3, 3, 17, 30}, tg = {5, 9, 36, 2, -100, 3, 3, -100, 30, -100};
  auto f = [&] {
    return model_forward_backward(c, lay, w.cptrs(), ids.data(), tg.data(), g, {}).loss;
  };
  UnitBuffers grad(lay);
  ModelStep st = model_forward_backward(c, lay, w.cptrs(), ids.data(), tg.data(), g, grad.ptrs());
  EXPECT_EQ(st.n_tokens, 7);
  EXPECT_NEAR(st.loss, f(), 1e-12);
  for (size_t u = 0; u < lay.units.size(); ++u)
    expect_unit_grad(f, lay.units[u], w.units[u], grad.units[u], "model unit " + std::to_string(u), 1e-2f,
                     /*fp32 noise of a loss ~3.6 over 2h*/ 3e-5);
  // All targets ignored: loss 0 and no gradient.
  std::vector<int32_t> none(10, -100);
  UnitBuffers g0(lay);
  st = model_forward_backward(c, lay, w.cptrs(), ids.data(), none.data(), g, g0.ptrs());
  EXPECT_EQ(st.n_tokens, 0);
  EXPECT_EQ(st.loss, 0.0);
  for (auto& u : g0.units)
    for (auto v : u) EXPECT_EQ(v, 0.0f);
}

TEST(Reference, LayerInPlaceAliasing) {
  // y may alias x in layer_forward, and dx may alias dy in layer_backward (the executor reuses buffers).
  LayerCase t(Arch::Qwen2, 2, 5, true);
  const int64_t n = t.g.tokens() * t.c.hidden;
  auto dy = randn(static_cast<size_t>(n), 800);
  std::vector<float> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n)), dw(static_cast<size_t>(t.lay.numel), 0.0f);
  layer_forward(t.c, t.lay, t.w.data(), t.g, t.x.data(), y.data());
  layer_backward(t.c, t.lay, t.w.data(), t.g, t.x.data(), dy.data(), dx.data(), dw.data());
  auto xy = t.x;
  layer_forward(t.c, t.lay, t.w.data(), t.g, xy.data(), xy.data());
  EXPECT_EQ(xy, y);
  auto d = dy;
  std::vector<float> dw2(static_cast<size_t>(t.lay.numel), 0.0f);
  layer_backward(t.c, t.lay, t.w.data(), t.g, t.x.data(), d.data(), d.data(), dw2.data());
  EXPECT_EQ(d, dx);
  EXPECT_EQ(dw2, dw);
}
