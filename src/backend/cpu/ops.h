// Op-level fp32 CPU reference kernels on raw row-major pointers.
// Used by the layer-level reference (reference.h), generation/KV-cache decode, and the CUDA tests.
//
// Conventions:
//  * Matrices are row-major. A linear weight W has HF shape [out, in]; y = x W^T + b.
//  * "_fwd" functions WRITE their outputs. In "_bwd" functions, input gradients (dx) are written
//    unless stated otherwise, and parameter gradients (dw, db) are ACCUMULATED (+=).
//  * Parameter-gradient reductions that are not GEMMs (norm weights, biases, embedding rows) add
//    row by row in row order, so splitting the rows into consecutive calls gives bit-identical
//    results. GEMM weight gradients (linear_bwd) are bit-identical under splitting only if the split
//    points are the same in both runs; the layer reference therefore always calls them per sample.
//  * Everything is deterministic for a given thread count.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/model_config.h"

namespace lt::cpu {

// ---------------------------------------------------------------- GEMM accounting
// Every sgemm issued by these ops is timed (wall clock) and its FLOPs counted (2*m*n*k).
struct GemmStats {
  double seconds = 0;
  double flops = 0;
  int64_t calls = 0;
};
GemmStats gemm_stats();
void reset_gemm_stats();

// C[m,n] = alpha * op(A) op(B) + beta * C, row-major (thin wrapper over cblas_sgemm, timed).
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// ---------------------------------------------------------------- RMSNorm
// y[r,:] = w * x[r,:] / sqrt(mean(x[r,:]^2) + eps), r < n, d = row length (HF Qwen2RMSNorm/LlamaRMSNorm).
void rmsnorm_fwd(const float* x, const float* w, int64_t n, int64_t d, float eps, float* y);
// dx written (or added when accumulate_dx); dw += (row order). dx may alias dy only if !accumulate_dx.
void rmsnorm_bwd(const float* x, const float* w, const float* dy, int64_t n, int64_t d, float eps, float* dx,
                 float* dw, bool accumulate_dx = false);
// The scale a norm applies for its stored weight: w itself, or (1 + w) in fp32 for models whose
// RMSNorm is zero-centred (Qwen3.5: HF computes x_hat * (1.0 + w.float())). The gradient with respect
// to w is the same in both cases, so the norm ops take the effective scale and accumulate dw as is.
class NormScale {
 public:
  NormScale(const float* w, int64_t d, bool plus_one);
  const float* get() const { return p_; }
 private:
  std::vector<float> buf_;
  const float* p_;
};

// ---------------------------------------------------------------- Linear (BLAS)
// y[n,out] = x[n,in] W[out,in]^T (+ b[out] if b != nullptr).
void linear_fwd(const float* x, const float* w, const float* b, int64_t n, int64_t in, int64_t out, float* y);
// dx[n,in] = dy W (or += when accumulate_dx; skipped if dx == nullptr); dw[out,in] += dy^T x;
// db[out] += column sums of dy in row order (skipped if db == nullptr).
void linear_bwd(const float* x, const float* w, const float* dy, int64_t n, int64_t in, int64_t out, float* dx,
                float* dw, float* db, bool accumulate_dx = false);

// ---------------------------------------------------------------- RoPE
// Inverse frequencies [head_dim/2] as HF computes them (default, or rope_scaling type "llama3" as in
// transformers' _compute_llama3_parameters). Throws lt::Error for unsupported scaling types.
// The ModelConfig form covers partial RoPE: [rotary_dim/2] frequencies of the rotated part.
std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling);
std::vector<float> rope_inv_freq(const ModelConfig& c);
// Rotates x [n, n_heads, head_dim] in place, row r at position pos[r] (HF rotate-half convention:
// out[i] = x[i] cos - x[i+D/2] sin, out[i+D/2] = x[i+D/2] cos + x[i] sin, angle = pos * inv_freq[i]).
// rot_dim (0 = head_dim): partial RoPE rotates the first rot_dim entries of each head (rotate-half
// within them, Qwen3.5) and leaves the rest unchanged.
void rope_fwd(float* x, int64_t n, int64_t n_heads, int64_t head_dim, const int32_t* pos, const float* inv_freq,
              int64_t rot_dim = 0);
// Backward of rope_fwd (the inverse rotation), in place on dx.
void rope_bwd(float* dx, int64_t n, int64_t n_heads, int64_t head_dim, const int32_t* pos, const float* inv_freq,
              int64_t rot_dim = 0);

// ---------------------------------------------------------------- QK-norm (Qwen3)
// Per-head RMSNorm over head_dim, weight w [head_dim] shared by heads: x [n, n_heads, head_dim].
void qk_norm_fwd(const float* x, const float* w, int64_t n, int64_t n_heads, int64_t head_dim, float eps, float* y);
void qk_norm_bwd(const float* x, const float* w, const float* dy, int64_t n, int64_t n_heads, int64_t head_dim,
                 float eps, float* dx, float* dw);

// ---------------------------------------------------------------- Attention
// Causal grouped-query attention for ONE sequence of S rows.
//   q [S, heads*D], k/v [S, kv_heads*D], out [S, heads*D]; query head h reads kv head h / (heads/kv_heads).
//   Row i attends to rows j <= i with segments[j] == segments[i] (segments may be nullptr: one segment).
//   scale is usually 1/sqrt(D). lse [heads, S] (optional, may be nullptr) receives each row's
//   log-sum-exp of the scaled scores. Memory: O(S) per thread, never [S,S] for all heads.
//   Work: when every segment id occupies one contiguous run (packed samples), each segment is computed
//   alone, sum of len^2 / 2 scores per head; otherwise the whole causal square S^2 / 2 with the mask.
struct AttnShape {
  int64_t seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
};
void attention_fwd(const AttnShape& s, const float* q, const float* k, const float* v, const int32_t* segments,
                   float* out, float* lse);
// Backward given the forward's out and lse. dq, dk, dv are WRITTEN.
void attention_bwd(const AttnShape& s, const float* q, const float* k, const float* v, const int32_t* segments,
                   const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv);
// Single-query decode against a KV cache (generation): q [heads*D] at position n_ctx-1 attends to
// k/v cache rows [0, n_ctx) of shape [n_ctx, kv_heads*D]; out [heads*D].
void attention_decode(const AttnShape& s, const float* q, const float* k_cache, const float* v_cache, int64_t n_ctx,
                      float* out);

// ---------------------------------------------------------------- SwiGLU
// act[n,f] = silu(gate) * up.
void swiglu_fwd(const float* gate, const float* up, int64_t n, int64_t f, float* act);
// dgate, dup written from dact.
void swiglu_bwd(const float* gate, const float* up, const float* dact, int64_t n, int64_t f, float* dgate,
                float* dup);

// ---------------------------------------------------------------- Embedding
// x[t,:] = emb[ids[t],:]. Throws lt::Error for ids outside [0, vocab).
void embedding_fwd(const float* emb, int64_t vocab, int64_t hidden, const int32_t* ids, int64_t n, float* x);
// demb[ids[t],:] += dx[t,:] in token order.
void embedding_bwd(const int32_t* ids, int64_t n, int64_t hidden, const float* dx, float* demb);

// ---------------------------------------------------------------- Cross-entropy
// logits [n, vocab] are overwritten with d(loss_sum * grad_scale)/dlogits (rows with target -100 get 0)
// when want_grad, else left unchanged. Per-row losses (fp32; lse from a double sum) are added in row
// order into *loss_sum; *n_valid is incremented by the number of non-ignored rows.
// lse != nullptr: receives each row's log-sum-exp (ignored rows: 0).
// Throws lt::Error for targets outside [0, vocab) other than -100.
void cross_entropy(float* logits, const int32_t* targets, int64_t n, int64_t vocab, float grad_scale,
                   bool want_grad, double* loss_sum, int64_t* n_valid, float* lse = nullptr);
// The same gradient in vocabulary columns [v0, v0 + n_v) of each row from its lse: z [n, n_v] (those columns' logits)
// is overwritten with (softmax - onehot) * grad_scale, as cross_entropy writes those columns.
void cross_entropy_slice_grad(float* z, const int32_t* targets, int64_t n, int64_t v0, int64_t n_v, const float* lse,
                              float grad_scale);

// AdamW with fp32 moments (Backend::adamw_step): the optimizer's fp32 element update (optim/adamw_kernels.h) in the
// same operations and order, over an fp32 master p, or (p null) the split master hi/lo (core/split_master.h).
void adamw_step(const AdamWStepScalars& s, float* p, bf16_t* hi, uint16_t* lo, const float* g, float* m, float* v,
                int64_t n);
// AdamW with 8-bit blockwise moments (Backend::adamw_step_q8): the optimizer's scalar 8-bit path (optim::adamw_q8)
// in the same operations and order, its quantiser on the maps' copy; master as in adamw_step.
void adamw_step_q8(const AdamWStepScalars& s, const Q8Maps& maps, float* p, bf16_t* hi, uint16_t* lo, const float* g,
                   uint8_t* mq, uint8_t* vq, float* ms, float* vs, int64_t n);

}  // namespace lt::cpu
