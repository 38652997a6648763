#include "backend/cuda/layer/layer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/finite_check.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"
#include "model/accounting.h"

namespace lt::cuda {

void Linear::fwd(const void* X, const void* W, const void* bias, void* Y, int64_t N, int64_t K, int64_t ldc,
                 float beta, const void* res) const {
  GemmArgs a;
  a.trans_b = true;
  a.m = T, a.n = N, a.k = K;
  a.a = X, a.b = W, a.c = Y, a.ldc = ldc, a.beta = beta, a.bias = bias, a.c_in = res;
  gemm.run(a, st);
}

void Linear::dx(const void* dY, int64_t ldy, const void* W, void* dX, int64_t N, int64_t K, float beta) const {
  GemmArgs a;
  a.m = T, a.n = K, a.k = N;
  a.a = dY, a.lda = ldy, a.b = W, a.c = dX, a.beta = beta;
  gemm.run(a, st);
}

void Linear::dw(const void* dY, int64_t ldy, const void* X, float* dW, int64_t N, int64_t K) const {
  GemmArgs a;
  a.trans_a = true;
  a.m = N, a.n = K, a.k = T;
  a.a = dY, a.lda = ldy, a.b = X, a.c = dW, a.c_f32 = true, a.beta = 1.f;
  gemm.run(a, st);
}

int64_t norm_rows_per_token(const ModelConfig& c) {
  int64_t r = std::max<int64_t>(c.heads, 1);
  if (c.count(LayerKind::GatedDeltaNet) > 0) r = std::max({r, c.linear.k_heads, c.linear.v_heads});
  return r;
}

namespace {
using u16 = uint16_t;

// Buffers of the part every layer kind shares, carved first (the mixer's follow), in the same order for
// the forward and the backward. Kept (mixer.h): x1 and the gate/up output; h, h2 and act are recomputed
// from x, x1 and gu by the kept backward (elementwise: ~1 % of the re-run they replace). The MLP runs in passes of
// R rows (mlp_pass_rows): act holds one pass, gu one pass in a plain call and all T rows when kept.
struct LayerBufs {
  u16 *x1, *gu;                  // kept
  u16 *h, *h2, *dx1, *act;       // scratch
  float *rstd, *partial;
};
template <typename C>
LayerBufs carve_layer(C& keep, C& scratch, const ModelConfig& c, int64_t T, int64_t R) {
  const int64_t H = c.hidden, F = c.ffn;
  const bool kept = &keep != &scratch;
  LayerBufs b{};
  b.x1 = keep.template take<u16>(T * H);
  b.gu = keep.template take<u16>((kept ? T : R) * 2 * F);
  b.h = scratch.template take<u16>(T * H);
  b.h2 = scratch.template take<u16>(T * H);
  b.dx1 = scratch.template take<u16>(T * H);
  b.act = scratch.template take<u16>(R * F);
  b.rstd = scratch.template take<float>(T * norm_rows_per_token(c));
  b.partial = scratch.template take<float>(norm_partial_floats(std::max({H, c.head_dim, c.linear.v_head_dim})));
  return b;
}

// The carves of one layer call: both parts in the workspace (plain call), or the kept part in the caller's
// buffer (kept internals).
struct Carves {
  Carve scratch, own_keep;
  Carve& keep;
  Carves(void* ws, void* keep_buf) : scratch(ws), own_keep(keep_buf), keep(keep_buf ? own_keep : scratch) {}
};

// The MLP's gate and up projections in one GEMM when their weights are adjacent (they are in the unit
// layout when F * H is a multiple of kParamAlign).
void mlp_gate_up(const Linear& L, const void* w, const UnitLayout& lay, const u16* h2, u16* gu, int64_t F,
                 int64_t H) {
  const u16* wg = wptr(w, lay, "mlp.gate_proj.weight");
  const u16* wu = wptr(w, lay, "mlp.up_proj.weight");
  if (wu == wg + F * H) {
    L.fwd(h2, wg, nullptr, gu, 2 * F, H, 0, 0.f);
  } else {
    L.fwd(h2, wg, nullptr, gu, F, H, 2 * F, 0.f);
    L.fwd(h2, wu, nullptr, gu + F, F, H, 2 * F, 0.f);
  }
}

// The MLP's backward for rows [r0, r0 + n): their gate/up output (recomputed, or the kept one), the activation again,
// dWd, dWg and dWu accumulated and h2's rows replaced by d h2.
void mlp_backward(Gemm& gemm, const ModelConfig& c, const UnitLayout& lay, const void* w, const LayerBufs& b,
                  int64_t r0, int64_t n, bool kept, const u16* dy, float* dw, cudaStream_t st) {
  const int64_t H = c.hidden, F = c.ffn;
  const Linear L{gemm, n, st};
  const u16* wg = wptr(w, lay, "mlp.gate_proj.weight");
  const u16* wu = wptr(w, lay, "mlp.up_proj.weight");
  const u16* wd = wptr(w, lay, "mlp.down_proj.weight");
  u16* gu = kept ? b.gu + r0 * 2 * F : b.gu;
  u16* h2 = b.h2 + r0 * H;
  if (!kept) mlp_gate_up(L, w, lay, h2, gu, F, H);
  swiglu_fwd(gu, n, F, b.act, st);
  L.dw(dy, 0, b.act, gptr(dw, lay, "mlp.down_proj.weight"), H, F);
  L.dx(dy, 0, wd, b.act, H, F, 0.f);        // act := d act
  swiglu_bwd(gu, b.act, n, F, gu, st);      // gu := d gu (in place)
  float* dwg = gptr(dw, lay, "mlp.gate_proj.weight");
  float* dwu = gptr(dw, lay, "mlp.up_proj.weight");
  if (wu == wg + F * H && dwu == dwg + F * H) {
    L.dw(gu, 0, h2, dwg, 2 * F, H);
    L.dx(gu, 0, wg, h2, 2 * F, H, 0.f);     // h2 := d h2
  } else {
    L.dw(gu, 2 * F, h2, dwg, F, H);
    L.dw(gu + F, 2 * F, h2, dwu, F, H);
    L.dx(gu, 2 * F, wg, h2, F, H, 0.f);
    L.dx(gu + F, 2 * F, wu, h2, F, H, 1.f);
  }
}

}  // namespace

LayerEngine::LayerEngine(const ModelConfig& c, Gemm& gemm, const float* inv_freq_dev, const KernelOptions& ko)
    : c_(c),
      gemm_(gemm),
      inv_freq_(inv_freq_dev),
      norm_off_(c.norm_plus_one ? 1.f : 0.f),
      check_finite_(ko.check_finite) {
  LT_CHECK(c.hidden % 8 == 0 && c.ffn % 2 == 0, "CUDA backend: hidden {} must be a multiple of 8, ffn {} even",
           c.hidden, c.ffn);
  for (int k = 0; k < kNumLayerKinds; ++k) {
    const auto kind = LayerKind(k);
    if (c.count(kind) == 0) continue;
    mixers_[size_t(k)] = kind == LayerKind::Attention ? make_attention_mixer(c_, gemm_, inv_freq_, ko)
                                                      : make_deltanet_mixer(c_, gemm_);
  }
}

LayerEngine::~LayerEngine() = default;

void LayerEngine::prepare(const Geo& g) {
  for (auto& m : mixers_)
    if (m) m->prepare(g);
}

Mixer& LayerEngine::mixer(const UnitLayout& lay) const {
  LT_CHECK(lay.kind == UnitKind::Layer, "CUDA layer op called with a non-layer unit layout");
  const auto k = size_t(c_.kind(lay.layer));
  LT_CHECK(mixers_[k] != nullptr, "CUDA backend: layer {} is of kind {}, which this model has no mixer for",
           lay.layer, layer_kind_short_name(c_.kind(lay.layer)));
  return *mixers_[k];
}

int64_t LayerEngine::layer_workspace_bytes(int64_t batch, int64_t seq) const {
  Carve cv(nullptr);
  carve_layer(cv, cv, c_, batch * seq, mlp_pass_rows(c_, batch * seq, mlp_bound_));
  int64_t most = 0;
  for (const auto& mx : mixers_)
    if (mx) most = std::max(most, mx->workspace_bytes(batch, seq));
  return cv.used + most;
}

int64_t LayerEngine::layer_keep_bytes(const UnitLayout& lay, int64_t batch, int64_t seq) const {
  Carve kc(nullptr), sc(nullptr);
  carve_layer(kc, sc, c_, batch * seq, mlp_pass_rows(c_, batch * seq, mlp_bound_));
  return kc.used + mixer(lay).keep_bytes(batch, seq);
}

int64_t LayerEngine::head_workspace_bytes(int64_t T) const {
  Carve cv(nullptr);
  const int64_t C = std::min(head_chunk_, std::max<int64_t>(T, 1));
  cv.take<u16>(T * c_.hidden);
  cv.take<u16>(T * c_.hidden);
  cv.take<float>(T);
  cv.take<float>(T);
  cv.take<float>(C * c_.vocab);
  cv.take<u16>(C * c_.vocab);
  cv.take<float>(norm_partial_floats(c_.hidden));
  return cv.used;
}

int64_t LayerEngine::embed_workspace_bytes(int64_t T) const { return embed_bwd_workspace_bytes(T); }

void LayerEngine::layer_forward(const UnitLayout& lay, const void* w, const Geo& g, const void* x, void* y, void* ws,
                                cudaStream_t st, void* keep) {
  const int64_t T = g.tokens(), H = c_.hidden, F = c_.ffn;
  const float eps = float(c_.rms_eps);
  if (T == 0) return;
  Mixer& mx = mixer(lay);
  Carves cv(ws, keep);
  const int64_t R = mlp_pass_rows(c_, T, mlp_bound_);
  LayerBufs b = carve_layer(cv.keep, cv.scratch, c_, T, R);
  rmsnorm_fwd(x, wptr(w, lay, "input_layernorm.weight"), T, H, eps, b.h, nullptr, st, norm_off_);
  mx.forward(MixerCall{lay, w, g, cv.keep, cv.scratch, {b.rstd, b.partial}, st}, b.h, x, b.x1);  // x1 = x + mixer(h)
  rmsnorm_fwd(b.x1, wptr(w, lay, "post_attention_layernorm.weight"), T, H, eps, b.h2, nullptr, st, norm_off_);
  const u16* wd = wptr(w, lay, "mlp.down_proj.weight");
  for (int64_t r0 = 0; r0 < T; r0 += R) {  // y = x1 + swiglu(h2 [Wg; Wu]^T) Wd^T, R rows at a time
    const int64_t n = std::min(R, T - r0);
    const Linear P{gemm_, n, st};
    u16* gu = keep ? b.gu + r0 * 2 * F : b.gu;
    mlp_gate_up(P, w, lay, b.h2 + r0 * H, gu, F, H);
    swiglu_fwd(gu, n, F, b.act, st);
    P.fwd(b.act, wd, nullptr, static_cast<u16*>(y) + r0 * H, H, F, 0, 1.f, b.x1 + r0 * H);
  }
  if (check_finite_) {
    check_finite_bf16(b.x1, T * H, fmt::format("layer {} forward: x + mixer(h)", lay.layer), st);
    check_finite_bf16(y, T * H, fmt::format("layer {} forward: output", lay.layer), st);
  }
}

void LayerEngine::layer_backward(const UnitLayout& lay, const void* w, const Geo& g, const void* x, const void* dy,
                                 void* dx, float* dw, void* ws, cudaStream_t st, void* keep) {
  const int64_t T = g.tokens(), H = c_.hidden;
  const float eps = float(c_.rms_eps);
  if (T == 0) return;
  LT_CHECK(dx != x, "layer_backward: dx must not alias x");
  Mixer& mx = mixer(lay);
  Carves cv(ws, keep);
  const int64_t R = mlp_pass_rows(c_, T, mlp_bound_);
  LayerBufs b = carve_layer(cv.keep, cv.scratch, c_, T, R);
  const MixerCall call{lay, w, g, cv.keep, cv.scratch, {b.rstd, b.partial}, st};
  const u16* ln1 = wptr(w, lay, "input_layernorm.weight");
  const u16* ln2 = wptr(w, lay, "post_attention_layernorm.weight");

  // ---- the forward internals: re-run from x, or (kept) the cheap ones rebuilt from what the forward kept
  rmsnorm_fwd(x, ln1, T, H, eps, b.h, nullptr, st, norm_off_);
  if (keep) {
    mx.bind(call);
  } else {
    mx.forward(call, b.h, x, b.x1);  // x1 = x + mixer(h)
  }
  rmsnorm_fwd(b.x1, ln2, T, H, eps, b.h2, nullptr, st, norm_off_);

  // ---- MLP backward, R rows at a time: h2 := d h2
  for (int64_t r0 = 0; r0 < T; r0 += R)
    mlp_backward(gemm_, c_, lay, w, b, r0, std::min(R, T - r0), keep != nullptr, static_cast<const u16*>(dy) + r0 * H,
                 dw, st);
  // dx1 = dy + norm2'(dh2)
  rmsnorm_bwd(b.x1, ln2, b.h2, dy, T, H, eps, b.dx1, gptr(dw, lay, "post_attention_layernorm.weight"), b.rstd,
              b.partial, st, norm_off_);

  // ---- mixer backward: h2 := dh
  mx.backward(call, b.h, b.dx1, b.h2, dw);
  rmsnorm_bwd(x, ln1, b.h2, b.dx1, T, H, eps, dx, gptr(dw, lay, "input_layernorm.weight"), b.rstd, b.partial, st,
              norm_off_);
  if (check_finite_) {
    check_finite_bf16(dy, T * H, fmt::format("layer {} backward: incoming gradient", lay.layer), st);
    check_finite_bf16(b.dx1, T * H, fmt::format("layer {} backward: d(x + mixer(h)) after the MLP", lay.layer), st);
    check_finite_bf16(b.h2, T * H, fmt::format("layer {} backward: d h after the mixer", lay.layer), st);
    check_finite_bf16(dx, T * H, fmt::format("layer {} backward: output gradient", lay.layer), st);
    check_finite_f32(dw, lay.numel, fmt::format("layer {} backward: weight gradients", lay.layer), st);
  }
}

void LayerEngine::embed_forward(const void* emb, const int32_t* ids, int64_t T, void* x, int* err, cudaStream_t st) {
  cuda::embed_fwd(emb, ids, T, c_.hidden, c_.vocab, x, err, st);
}

void LayerEngine::embed_backward(const int32_t* ids, int64_t T, const void* dx, float* demb, void* ws,
                                 int64_t ws_bytes, cudaStream_t st) {
  cuda::embed_bwd(ids, T, c_.hidden, c_.vocab, dx, demb, ws, ws_bytes, st);
}

namespace {

// dW[nv, H] (fp32) += dlogits[n, nv]^T hn[n, H]: the LM weight's gradient from n rows.
void lm_grad_rows(Gemm& gemm, const u16* dlog, const u16* hn, int64_t n, int64_t nv, int64_t H, float* dw,
                  cudaStream_t st) {
  GemmArgs d;
  d.trans_a = true;
  d.m = nv, d.n = H, d.k = n;
  d.a = dlog, d.b = hn, d.c = dw, d.c_f32 = true, d.beta = 1.f;
  gemm.run(d, st);
}

}  // namespace

void LayerEngine::head_loss(const UnitLayout& lay, const void* head_w, const void* lm_w, const int32_t* targets,
                            int64_t T, const void* x, float loss_scale, void* dx, float* d_norm_w, float* d_lm_w,
                            float* lse, double* acc, int* err, void* ws, cudaStream_t st) {
  if (T == 0) return;
  const int64_t H = c_.hidden, V = c_.vocab;
  const float eps = float(c_.rms_eps);
  const bool grad = dx != nullptr;
  LT_CHECK(!grad || d_norm_w, "head_loss: dx given without d_norm_w");
  const int64_t C = std::min(head_chunk_, T);
  Carve cv(ws);
  u16* hn = cv.take<u16>(T * H);
  u16* dhn = cv.take<u16>(T * H);
  float* rstd = cv.take<float>(T);
  float* row_loss = cv.take<float>(T);
  float* logits = cv.take<float>(C * V);
  u16* dlog = cv.take<u16>(C * V);
  float* partial = cv.take<float>(norm_partial_floats(H));
  const ParamInfo& nw = lay.find("norm.weight");
  const u16* norm_w = static_cast<const u16*>(head_w) + nw.offset;
  rmsnorm_fwd(x, norm_w, T, H, eps, hn, nullptr, st, norm_off_);
  for (int64_t r0 = 0; r0 < T; r0 += C) {
    const int64_t n = std::min(C, T - r0);
    GemmArgs a;  // logits[n, V] = hn W^T (fp32)
    a.trans_b = true;
    a.m = n, a.n = V, a.k = H;
    a.a = hn + r0 * H, a.b = lm_w, a.c = logits, a.c_f32 = true;
    gemm_.run(a, st);
    cross_entropy(logits, targets + r0, n, V, loss_scale, grad ? dlog : nullptr, row_loss + r0, err, st,
                  lse ? lse + r0 : nullptr);
    if (!grad) continue;
    GemmArgs d;  // dhn[n, H] = dlogits W
    d.m = n, d.n = H, d.k = V;
    d.a = dlog, d.b = lm_w, d.c = dhn + r0 * H;
    gemm_.run(d, st);
    if (d_lm_w) lm_grad_rows(gemm_, dlog, hn + r0 * H, n, V, H, d_lm_w, st);
  }
  loss_accumulate(row_loss, targets, T, acc, st);
  if (grad) rmsnorm_bwd(x, norm_w, dhn, nullptr, T, H, eps, dx, d_norm_w, rstd, partial, st, norm_off_);
}

// The slice's logits again in the chunks head_loss takes (head_chunk_ rows), their gradient from lse, and
// dW[v0 .. v0+nv) += dlogits^T hn in head_loss's order. Carved like head_loss, the logits [C, nv] <= [C, V].
void LayerEngine::head_lm_grad_slice(const UnitLayout& lay, const void* head_w, const void* lm_w,
                                     const int32_t* targets, int64_t T, const void* x, const float* lse,
                                     float loss_scale, int64_t v0, int64_t nv, float* dw, void* ws, cudaStream_t st) {
  if (T == 0) return;
  const int64_t H = c_.hidden, V = c_.vocab;
  LT_CHECK(v0 >= 0 && nv >= 1 && v0 + nv <= V, "head_lm_grad_slice: columns [{}, {}) outside the vocabulary of {}", v0,
           v0 + nv, V);
  const int64_t C = std::min(head_chunk_, T);
  Carve cv(ws);
  u16* hn = cv.take<u16>(T * H);
  float* logits = cv.take<float>(C * nv);
  u16* dlog = cv.take<u16>(C * nv);
  const u16* norm_w = static_cast<const u16*>(head_w) + lay.find("norm.weight").offset;
  const u16* w_slice = static_cast<const u16*>(lm_w) + v0 * H;
  rmsnorm_fwd(x, norm_w, T, H, float(c_.rms_eps), hn, nullptr, st, norm_off_);
  for (int64_t r0 = 0; r0 < T; r0 += C) {
    const int64_t n = std::min(C, T - r0);
    GemmArgs a;  // logits[n, nv] = hn W[v0 .. v0+nv)^T (fp32)
    a.trans_b = true;
    a.m = n, a.n = nv, a.k = H;
    a.a = hn + r0 * H, a.b = w_slice, a.c = logits, a.c_f32 = true;
    gemm_.run(a, st);
    cross_entropy_slice_grad(logits, targets + r0, n, v0, nv, V, lse + r0, loss_scale, dlog, st);
    lm_grad_rows(gemm_, dlog, hn + r0 * H, n, nv, H, dw, st);
  }
}

void LayerEngine::head_logits(const UnitLayout& lay, const void* head_w, const void* lm_w, const void* x,
                              const int64_t* rows, int64_t n_rows, float* out, void* ws, cudaStream_t st) {
  if (n_rows == 0) return;
  const int64_t H = c_.hidden;
  Carve cv(ws);
  u16* xr = cv.take<u16>(n_rows * H);
  u16* hn = cv.take<u16>(n_rows * H);
  gather_rows(x, rows, n_rows, H, xr, st);
  const u16* norm_w = static_cast<const u16*>(head_w) + lay.find("norm.weight").offset;
  rmsnorm_fwd(xr, norm_w, n_rows, H, float(c_.rms_eps), hn, nullptr, st, norm_off_);
  GemmArgs a;
  a.trans_b = true;
  a.m = n_rows, a.n = c_.vocab, a.k = H;
  a.a = hn, a.b = lm_w, a.c = out, a.c_f32 = true;
  gemm_.run(a, st);
}

}  // namespace lt::cuda
