#include "backend/cuda/layer.h"

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace lt::cuda {

// Bump allocator over the caller's workspace (256-byte aligned pieces). With base == nullptr it only
// counts bytes (used by *_workspace_bytes so the sizes always match the carving).
struct LayerEngine::Carve {
  char* base;
  int64_t used = 0;
  explicit Carve(void* b) : base(static_cast<char*>(b)) {}
  template <typename T>
  T* take(int64_t n) {
    const int64_t bytes = (n * int64_t(sizeof(T)) + 255) / 256 * 256;
    T* p = base ? reinterpret_cast<T*>(base + used) : nullptr;
    used += bytes;
    return p;
  }
};

namespace {
using u16 = uint16_t;

const u16* wptr(const void* w, const UnitLayout& lay, const char* s) {
  return static_cast<const u16*>(w) + lay.find(s).offset;
}
const u16* wopt(const void* w, const UnitLayout& lay, const char* s) {
  const ParamInfo* p = lay.try_find(s);
  return p ? static_cast<const u16*>(w) + p->offset : nullptr;
}
float* gptr(float* dw, const UnitLayout& lay, const char* s) { return dw + lay.find(s).offset; }
float* gopt(float* dw, const UnitLayout& lay, const char* s) {
  const ParamInfo* p = lay.try_find(s);
  return p ? dw + p->offset : nullptr;
}

// Layer buffers, carved in the same order for the forward and the backward.
struct LayerBufs {
  u16 *h, *x1, *h2, *dx1, *q, *o, *dout, *k, *v, *dk, *dv, *q_raw, *k_raw, *gu, *act;
  float *lse, *delta, *dq_acc, *dkv_acc, *rstd, *partial;
};
template <typename C>
LayerBufs carve_layer(C& cv, const ModelConfig& c, int64_t T) {
  const int64_t H = c.hidden, QD = c.q_dim(), KD = c.kv_dim(), F = c.ffn;
  LayerBufs b{};
  b.h = cv.template take<u16>(T * H);
  b.x1 = cv.template take<u16>(T * H);
  b.h2 = cv.template take<u16>(T * H);
  b.dx1 = cv.template take<u16>(T * H);
  b.q = cv.template take<u16>(T * QD);
  b.o = cv.template take<u16>(T * QD);
  b.dout = cv.template take<u16>(T * QD);
  b.k = cv.template take<u16>(T * KD);
  b.v = cv.template take<u16>(T * KD);
  b.dk = cv.template take<u16>(T * KD);
  b.dv = cv.template take<u16>(T * KD);
  b.q_raw = c.qk_norm ? cv.template take<u16>(T * QD) : nullptr;
  b.k_raw = c.qk_norm ? cv.template take<u16>(T * KD) : nullptr;
  b.gu = cv.template take<u16>(T * 2 * F);
  b.act = cv.template take<u16>(T * F);
  b.lse = cv.template take<float>(T * c.heads);
  b.delta = cv.template take<float>(T * c.heads);
  b.dq_acc = cv.template take<float>(T * QD);
  b.dkv_acc = attention_supported(c.head_dim) ? nullptr : cv.template take<float>(2 * T * KD);
  b.rstd = cv.template take<float>(T * std::max<int64_t>(c.heads, 1));
  b.partial = cv.template take<float>(norm_partial_floats(std::max(H, c.head_dim)));
  return b;
}

AttnDims attn_dims(const ModelConfig& c, const Geo& g) {
  AttnDims d;
  d.batch = g.batch;
  d.seq = g.seq;
  d.heads = c.heads;
  d.kv_heads = c.kv_heads;
  d.head_dim = c.head_dim;
  d.scale = float(1.0 / std::sqrt(double(c.head_dim)));
  return d;
}

}  // namespace

LayerEngine::LayerEngine(const ModelConfig& c, Gemm& gemm, const float* inv_freq_dev)
    : c_(c), gemm_(gemm), inv_freq_(inv_freq_dev) {
  LT_CHECK(c.head_dim % 2 == 0 && c.head_dim % 8 == 0 && c.head_dim <= 256,
           "CUDA backend: head_dim {} is not supported (a multiple of 8 up to 256)", c.head_dim);
  LT_CHECK(c.hidden % 8 == 0 && c.ffn % 2 == 0, "CUDA backend: hidden {} must be a multiple of 8, ffn {} even",
           c.hidden, c.ffn);
}

int64_t LayerEngine::layer_workspace_bytes(int64_t T) const {
  Carve cv(nullptr);
  carve_layer(cv, c_, T);
  return cv.used;
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
                                cudaStream_t st) {
  const int64_t T = g.tokens(), H = c_.hidden, QD = c_.q_dim(), KD = c_.kv_dim(), F = c_.ffn;
  const float eps = float(c_.rms_eps);
  if (T == 0) return;
  Carve cv(ws);
  LayerBufs b = carve_layer(cv, c_, T);
  auto lin = [&](const void* X, const u16* W, const u16* bias, void* Y, int64_t N, int64_t K, int64_t ldc,
                 float beta, const void* res = nullptr) {
    GemmArgs a;
    a.trans_b = true;
    a.m = T, a.n = N, a.k = K;
    a.a = X, a.b = W, a.c = Y, a.ldc = ldc, a.beta = beta, a.bias = bias, a.c_in = res;
    gemm_.run(a, st);
  };
  rmsnorm_fwd(x, wptr(w, lay, "input_layernorm.weight"), T, H, eps, b.h, nullptr, st);
  lin(b.h, wptr(w, lay, "self_attn.q_proj.weight"), wopt(w, lay, "self_attn.q_proj.bias"), b.q, QD, H, 0, 0.f);
  lin(b.h, wptr(w, lay, "self_attn.k_proj.weight"), wopt(w, lay, "self_attn.k_proj.bias"), b.k, KD, H, 0, 0.f);
  lin(b.h, wptr(w, lay, "self_attn.v_proj.weight"), wopt(w, lay, "self_attn.v_proj.bias"), b.v, KD, H, 0, 0.f);
  if (c_.qk_norm) {
    rmsnorm_fwd(b.q, wptr(w, lay, "self_attn.q_norm.weight"), T * c_.heads, c_.head_dim, eps, b.q, nullptr, st);
    rmsnorm_fwd(b.k, wptr(w, lay, "self_attn.k_norm.weight"), T * c_.kv_heads, c_.head_dim, eps, b.k, nullptr, st);
  }
  rope_apply(b.q, nullptr, T, c_.heads, c_.head_dim, g.positions, g.seq, inv_freq_, false, st);
  rope_apply(b.k, nullptr, T, c_.kv_heads, c_.head_dim, g.positions, g.seq, inv_freq_, false, st);
  attention_fwd(attn_dims(c_, g), b.q, b.k, b.v, g.segments, b.o, b.lse, st);
  lin(b.o, wptr(w, lay, "self_attn.o_proj.weight"), nullptr, b.x1, H, QD, 0, 1.f, x);  // x1 = x + o Wo^T
  rmsnorm_fwd(b.x1, wptr(w, lay, "post_attention_layernorm.weight"), T, H, eps, b.h2, nullptr, st);
  const u16* wg = wptr(w, lay, "mlp.gate_proj.weight");
  const u16* wu = wptr(w, lay, "mlp.up_proj.weight");
  if (wu == wg + F * H) {
    lin(b.h2, wg, nullptr, b.gu, 2 * F, H, 0, 0.f);
  } else {
    lin(b.h2, wg, nullptr, b.gu, F, H, 2 * F, 0.f);
    lin(b.h2, wu, nullptr, b.gu + F, F, H, 2 * F, 0.f);
  }
  swiglu_fwd(b.gu, T, F, b.act, st);
  lin(b.act, wptr(w, lay, "mlp.down_proj.weight"), nullptr, y, H, F, 0, 1.f, b.x1);  // y = x1 + act Wd^T
}

void LayerEngine::layer_backward(const UnitLayout& lay, const void* w, const Geo& g, const void* x, const void* dy,
                                 void* dx, float* dw, void* ws, cudaStream_t st) {
  const int64_t T = g.tokens(), H = c_.hidden, QD = c_.q_dim(), KD = c_.kv_dim(), F = c_.ffn;
  const int64_t nh = c_.heads, nkv = c_.kv_heads, hd = c_.head_dim;
  const float eps = float(c_.rms_eps);
  if (T == 0) return;
  LT_CHECK(dx != x, "layer_backward: dx must not alias x");
  Carve cv(ws);
  LayerBufs b = carve_layer(cv, c_, T);
  // Y[T,N] = X W^T (+bias) (+ beta Y, or beta res when res is given)
  auto lin = [&](const void* X, const u16* W, const u16* bias, void* Y, int64_t N, int64_t K, int64_t ldc,
                 float beta, const void* res = nullptr) {
    GemmArgs a;
    a.trans_b = true;
    a.m = T, a.n = N, a.k = K;
    a.a = X, a.b = W, a.c = Y, a.ldc = ldc, a.beta = beta, a.bias = bias, a.c_in = res;
    gemm_.run(a, st);
  };
  // dX[T,K] (+)= dY[T,N] W[N,K]
  auto lin_dx = [&](const void* dY, int64_t ldy, const u16* W, void* dX, int64_t N, int64_t K, float beta) {
    GemmArgs a;
    a.m = T, a.n = K, a.k = N;
    a.a = dY, a.lda = ldy, a.b = W, a.c = dX, a.beta = beta;
    gemm_.run(a, st);
  };
  // dW[N,K] += dY^T X (fp32)
  auto lin_dw = [&](const void* dY, int64_t ldy, const void* X, float* dW, int64_t N, int64_t K) {
    GemmArgs a;
    a.trans_a = true;
    a.m = N, a.n = K, a.k = T;
    a.a = dY, a.lda = ldy, a.b = X, a.c = dW, a.c_f32 = true, a.beta = 1.f;
    gemm_.run(a, st);
  };

  // ---- recompute the forward internals
  const u16* ln1 = wptr(w, lay, "input_layernorm.weight");
  const u16* wq = wptr(w, lay, "self_attn.q_proj.weight");
  const u16* wk = wptr(w, lay, "self_attn.k_proj.weight");
  const u16* wv = wptr(w, lay, "self_attn.v_proj.weight");
  const u16* wo = wptr(w, lay, "self_attn.o_proj.weight");
  const u16* ln2 = wptr(w, lay, "post_attention_layernorm.weight");
  const u16* wg = wptr(w, lay, "mlp.gate_proj.weight");
  const u16* wu = wptr(w, lay, "mlp.up_proj.weight");
  const u16* wd = wptr(w, lay, "mlp.down_proj.weight");
  const bool gu_fused = wu == wg + F * H;
  rmsnorm_fwd(x, ln1, T, H, eps, b.h, nullptr, st);
  u16* qpre = c_.qk_norm ? b.q_raw : b.q;
  u16* kpre = c_.qk_norm ? b.k_raw : b.k;
  lin(b.h, wq, wopt(w, lay, "self_attn.q_proj.bias"), qpre, QD, H, 0, 0.f);
  lin(b.h, wk, wopt(w, lay, "self_attn.k_proj.bias"), kpre, KD, H, 0, 0.f);
  lin(b.h, wv, wopt(w, lay, "self_attn.v_proj.bias"), b.v, KD, H, 0, 0.f);
  if (c_.qk_norm) {
    rmsnorm_fwd(b.q_raw, wptr(w, lay, "self_attn.q_norm.weight"), T * nh, hd, eps, b.q, nullptr, st);
    rmsnorm_fwd(b.k_raw, wptr(w, lay, "self_attn.k_norm.weight"), T * nkv, hd, eps, b.k, nullptr, st);
  }
  rope_apply(b.q, nullptr, T, nh, hd, g.positions, g.seq, inv_freq_, false, st);
  rope_apply(b.k, nullptr, T, nkv, hd, g.positions, g.seq, inv_freq_, false, st);
  const AttnDims ad = attn_dims(c_, g);
  attention_fwd(ad, b.q, b.k, b.v, g.segments, b.o, b.lse, st);
  lin(b.o, wo, nullptr, b.x1, H, QD, 0, 1.f, x);  // x1 = x + o Wo^T
  rmsnorm_fwd(b.x1, ln2, T, H, eps, b.h2, nullptr, st);
  if (gu_fused) {
    lin(b.h2, wg, nullptr, b.gu, 2 * F, H, 0, 0.f);
  } else {
    lin(b.h2, wg, nullptr, b.gu, F, H, 2 * F, 0.f);
    lin(b.h2, wu, nullptr, b.gu + F, F, H, 2 * F, 0.f);
  }
  swiglu_fwd(b.gu, T, F, b.act, st);

  // ---- MLP backward
  lin_dw(dy, 0, b.act, gptr(dw, lay, "mlp.down_proj.weight"), H, F);
  lin_dx(dy, 0, wd, b.act, H, F, 0.f);           // act := d act
  swiglu_bwd(b.gu, b.act, T, F, b.gu, st);        // gu := d gu (in place)
  float* dwg = gptr(dw, lay, "mlp.gate_proj.weight");
  float* dwu = gptr(dw, lay, "mlp.up_proj.weight");
  if (gu_fused && dwu == dwg + F * H) {
    lin_dw(b.gu, 0, b.h2, dwg, 2 * F, H);
    lin_dx(b.gu, 0, wg, b.h2, 2 * F, H, 0.f);     // h2 := d h2
  } else {
    lin_dw(b.gu, 2 * F, b.h2, dwg, F, H);
    lin_dw(b.gu + F, 2 * F, b.h2, dwu, F, H);
    lin_dx(b.gu, 2 * F, wg, b.h2, F, H, 0.f);
    lin_dx(b.gu + F, 2 * F, wu, b.h2, F, H, 1.f);
  }
  // dx1 = dy + norm2'(dh2)
  rmsnorm_bwd(b.x1, ln2, b.h2, dy, T, H, eps, b.dx1, gptr(dw, lay, "post_attention_layernorm.weight"), b.rstd,
              b.partial, st);

  // ---- attention backward
  lin_dw(b.dx1, 0, b.o, gptr(dw, lay, "self_attn.o_proj.weight"), H, QD);
  lin_dx(b.dx1, 0, wo, b.dout, H, QD, 0.f);
  attention_bwd_f32dq(ad, b.q, b.k, b.v, g.segments, b.o, b.lse, b.dout, b.dk, b.dv, b.dq_acc, b.delta, b.dkv_acc, st);
  u16* dq = b.o;  // o is free now: dq (after inverse RoPE) goes there
  rope_apply(dq, b.dq_acc, T, nh, hd, g.positions, g.seq, inv_freq_, true, st);
  rope_apply(b.dk, nullptr, T, nkv, hd, g.positions, g.seq, inv_freq_, true, st);
  u16* dk = b.dk;
  if (c_.qk_norm) {
    rmsnorm_bwd(b.q_raw, wptr(w, lay, "self_attn.q_norm.weight"), dq, nullptr, T * nh, hd, eps, b.q,
                gptr(dw, lay, "self_attn.q_norm.weight"), b.rstd, b.partial, st);
    rmsnorm_bwd(b.k_raw, wptr(w, lay, "self_attn.k_norm.weight"), dk, nullptr, T * nkv, hd, eps, b.k,
                gptr(dw, lay, "self_attn.k_norm.weight"), b.rstd, b.partial, st);
    dq = b.q;
    dk = b.k;
  }
  if (float* db = gopt(dw, lay, "self_attn.q_proj.bias")) colsum_accum(dq, T, QD, db, b.partial, st);
  if (float* db = gopt(dw, lay, "self_attn.k_proj.bias")) colsum_accum(dk, T, KD, db, b.partial, st);
  if (float* db = gopt(dw, lay, "self_attn.v_proj.bias")) colsum_accum(b.dv, T, KD, db, b.partial, st);
  lin_dw(dq, 0, b.h, gptr(dw, lay, "self_attn.q_proj.weight"), QD, H);
  lin_dw(dk, 0, b.h, gptr(dw, lay, "self_attn.k_proj.weight"), KD, H);
  lin_dw(b.dv, 0, b.h, gptr(dw, lay, "self_attn.v_proj.weight"), KD, H);
  lin_dx(dq, 0, wq, b.h2, QD, H, 0.f);  // h2 := dh
  lin_dx(dk, 0, wk, b.h2, KD, H, 1.f);
  lin_dx(b.dv, 0, wv, b.h2, KD, H, 1.f);
  rmsnorm_bwd(x, ln1, b.h2, b.dx1, T, H, eps, dx, gptr(dw, lay, "input_layernorm.weight"), b.rstd, b.partial, st);
}

void LayerEngine::embed_forward(const void* emb, const int32_t* ids, int64_t T, void* x, int* err, cudaStream_t st) {
  cuda::embed_fwd(emb, ids, T, c_.hidden, c_.vocab, x, err, st);
}

void LayerEngine::embed_backward(const int32_t* ids, int64_t T, const void* dx, float* demb, void* ws,
                                 int64_t ws_bytes, cudaStream_t st) {
  cuda::embed_bwd(ids, T, c_.hidden, c_.vocab, dx, demb, ws, ws_bytes, st);
}

void LayerEngine::head_loss(const UnitLayout& lay, const void* head_w, const void* lm_w, const int32_t* targets,
                            int64_t T, const void* x, float loss_scale, void* dx, float* d_head_w, float* d_lm_w,
                            double* acc, int* err, void* ws, cudaStream_t st) {
  if (T == 0) return;
  const int64_t H = c_.hidden, V = c_.vocab;
  const float eps = float(c_.rms_eps);
  const bool grad = dx != nullptr;
  LT_CHECK(!grad || (d_head_w && d_lm_w), "head_loss: dx given without d_head_w/d_lm_w");
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
  rmsnorm_fwd(x, norm_w, T, H, eps, hn, nullptr, st);
  for (int64_t r0 = 0; r0 < T; r0 += C) {
    const int64_t n = std::min(C, T - r0);
    GemmArgs a;  // logits[n, V] = hn W^T (fp32)
    a.trans_b = true;
    a.m = n, a.n = V, a.k = H;
    a.a = hn + r0 * H, a.b = lm_w, a.c = logits, a.c_f32 = true;
    gemm_.run(a, st);
    cross_entropy(logits, targets + r0, n, V, loss_scale, grad ? dlog : nullptr, row_loss + r0, err, st);
    if (!grad) continue;
    GemmArgs d;  // dhn[n, H] = dlogits W
    d.m = n, d.n = H, d.k = V;
    d.a = dlog, d.b = lm_w, d.c = dhn + r0 * H;
    gemm_.run(d, st);
    GemmArgs dwa;  // dW[V, H] += dlogits^T hn
    dwa.trans_a = true;
    dwa.m = V, dwa.n = H, dwa.k = n;
    dwa.a = dlog, dwa.b = hn + r0 * H, dwa.c = d_lm_w, dwa.c_f32 = true, dwa.beta = 1.f;
    gemm_.run(dwa, st);
  }
  loss_accumulate(row_loss, targets, T, acc, st);
  if (grad) rmsnorm_bwd(x, norm_w, dhn, nullptr, T, H, eps, dx, d_head_w + nw.offset, rstd, partial, st);
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
  rmsnorm_fwd(xr, norm_w, n_rows, H, float(c_.rms_eps), hn, nullptr, st);
  GemmArgs a;
  a.trans_b = true;
  a.m = n_rows, a.n = c_.vocab, a.k = H;
  a.a = hn, a.b = lm_w, a.c = out, a.c_f32 = true;
  gemm_.run(a, st);
}

}  // namespace lt::cuda
