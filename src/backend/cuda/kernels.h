// Launchers of the CUDA backend's kernels. C++17-clean: included from .cu files (nvcc, C++17) and
// from the backend's C++20 sources. bf16 tensors are passed as void* (device __nv_bfloat16).
// Layouts follow src/backend/cpu/ops.h: row-major, activations [T, features], sample-major rows.
// Every launcher enqueues on `st` and checks the launch; none synchronizes.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace lt::cuda {

// ---------------------------------------------------------------- attention (flash-style)
// Causal GQA attention over `batch` samples of `seq` rows. q/o [T, heads*hd], k/v [T, kv_heads*hd]
// (T = batch*seq, bf16). segments: device int32 [T] or nullptr; row i sees rows j <= i of its sample
// with segments[j] == segments[i]. lse: fp32 [T, heads], natural log of the sum of exp(scaled scores).
// The S x S score matrix never exists in device memory.
struct AttnDims {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  int64_t tokens() const { return batch * seq; }
};
// True when the tensor-core kernels cover head_dim (64, 128; 256 when the device's opt-in shared memory
// per block is >= 225 KiB, i.e. sm_90, unless LT_ATTN_HD256=generic); other even head dims <= 256 take
// the generic kernels (attention_generic.cu), which attention_fwd/attention_bwd* dispatch to.
bool attention_supported(int64_t head_dim);
void attention_fwd(const AttnDims& d, const void* q, const void* k, const void* v, const int32_t* segments, void* o,
                   float* lse, cudaStream_t st);
// Writes dq, dk, dv (bf16). Workspace: dq_acc fp32 [T, heads*hd] and delta fp32 [T, heads].
void attention_bwd(const AttnDims& d, const void* q, const void* k, const void* v, const int32_t* segments,
                   const void* o, const float* lse, const void* dout, void* dq, void* dk, void* dv, float* dq_acc,
                   float* delta, float* dkv_acc, cudaStream_t st);
// Same, but leaves the final dQ in fp32 in dq_acc and skips its bf16 conversion.
// dkv_acc: fp32 [2, T, kv_heads*hd] workspace, used only by the generic path (may be null otherwise).
void attention_bwd_f32dq(const AttnDims& d, const void* q, const void* k, const void* v, const int32_t* segments,
                         const void* o, const float* lse, const void* dout, void* dk, void* dv, float* dq_acc,
                         float* delta, float* dkv_acc, cudaStream_t st);
void attention_fwd_generic(const AttnDims& d, const void* q, const void* k, const void* v, const int32_t* segments,
                           void* o, float* lse, cudaStream_t st);
void attention_bwd_generic(const AttnDims& d, const void* q, const void* k, const void* v, const int32_t* segments,
                           const void* o, const float* lse, const void* dout, void* dk, void* dv, float* dq_f32,
                           float* dkv_f32, cudaStream_t st);

// ---------------------------------------------------------------- RMSNorm (also QK-norm: rows = T*heads)
// y = (w + w_offset) * x / sqrt(mean(x^2) + eps); x, w, y bf16. rstd (optional, fp32 [rows]) receives
// 1/sqrt(...). w_offset = 1 gives Qwen3.5's zero-centred (1 + w) norms (ModelConfig::norm_plus_one).
void rmsnorm_fwd(const void* x, const void* w, int64_t rows, int64_t dim, float eps, void* y, float* rstd,
                 cudaStream_t st, float w_offset = 0.f);
// dx = (dres ? dres : 0) + d/dx (dx may alias dres); dw (fp32 [dim]) += sum over rows in a fixed order
// (the same for any w_offset). Workspace: rstd fp32 [rows], partial fp32 [norm_partial_floats(dim)].
void rmsnorm_bwd(const void* x, const void* w, const void* dy, const void* dres, int64_t rows, int64_t dim, float eps,
                 void* dx, float* dw, float* rstd, float* partial, cudaStream_t st, float w_offset = 0.f);
int64_t norm_partial_floats(int64_t dim);
// rmsnorm_bwd at dim >= 1024 fuses the dw column sums into the dx kernel; KernelOptions::norm_bwd = Split
// (kernel_options.h, env LT_NORM_BWD=split) forces the two-kernel path, a comparison variant for the tests.
// db (fp32 [dim]) += column sums of a (bf16 [rows, dim]), deterministic. Workspace as above.
void colsum_accum(const void* a, int64_t rows, int64_t dim, float* db, float* partial, cudaStream_t st);

// ---------------------------------------------------------------- RoPE
// In place on x (bf16 [rows, heads*hd]); position of row r: pos[r] if pos else r % seq.
// inv_freq: device fp32 [rot/2]. inverse=true applies the transposed rotation (backward).
// When src_f32 != nullptr, reads fp32 src [rows, heads*hd] instead of x and writes bf16 x (every entry).
// rot_dim (0 = hd): partial RoPE rotates the first rot_dim entries of each head (rotate-half within
// them, pairs (i, i + rot_dim/2)); the other entries pass through (Qwen3.5: rot_dim = hd / 4).
void rope_apply(void* x, const float* src_f32, int64_t rows, int64_t heads, int64_t hd, const int32_t* pos,
                int64_t seq, const float* inv_freq, bool inverse, cudaStream_t st, int64_t rot_dim = 0);

// ---------------------------------------------------------------- gated attention (Qwen3.5 full layers)
// src [rows, 2d] -> a [rows, d] (first half of each row), b [rows, d] (second half): q_proj's per-head
// (query, gate) output with rows = T * heads, d = head_dim (HF torch.chunk on the last dim).
void split_halves(const void* src, int64_t rows, int64_t d, void* a, void* b, cudaStream_t st);
// The inverse: dst [rows, 2d] = [a | b] per row.
void join_halves(const void* a, const void* b, int64_t rows, int64_t d, void* dst, cudaStream_t st);
// out = o * sigmoid(gate), n elements (bf16).
void sigmoid_gate_fwd(const void* o, const void* gate, int64_t n, void* out, cudaStream_t st);
// From dout = d(o * sigmoid(gate)): d_o = dout * s, dgate = dout * o * s * (1 - s), s = sigmoid(gate).
// Element-wise: the outputs may alias the inputs.
void sigmoid_gate_bwd(const void* o, const void* gate, const void* dout, int64_t n, void* d_o, void* dgate,
                      cudaStream_t st);

// ---------------------------------------------------------------- SwiGLU on the fused gate|up output
// gu bf16 [rows, 2f] (gate in columns [0,f), up in [f,2f)); act bf16 [rows, f] = silu(gate) * up.
void swiglu_fwd(const void* gu, int64_t rows, int64_t f, void* act, cudaStream_t st);
// dgu bf16 [rows, 2f] from dact.
void swiglu_bwd(const void* gu, const void* dact, int64_t rows, int64_t f, void* dgu, cudaStream_t st);

// ---------------------------------------------------------------- residual add
void add_bf16(const void* a, const void* b, int64_t n, void* out, cudaStream_t st);  // out may alias a or b

// ---------------------------------------------------------------- embedding
// x[t] = emb[ids[t]] (bf16). Ids outside [0, vocab) set *err (device int) to 1 and give zero rows.
void embed_fwd(const void* emb, const int32_t* ids, int64_t n, int64_t hidden, int64_t vocab, void* x, int* err,
               cudaStream_t st);
// demb (fp32 [vocab, hidden]) [ids[t]] += dx[t] (bf16), summed per row in token order (deterministic:
// stable radix sort of (id, t), then one ordered pass per distinct id).
int64_t embed_bwd_workspace_bytes(int64_t n);
void embed_bwd(const int32_t* ids, int64_t n, int64_t hidden, int64_t vocab, const void* dx, float* demb,
               void* workspace, int64_t workspace_bytes, cudaStream_t st);
// The same sums added into a bf16 table, each element rounded once (add_f32_to_bf16's rounding of the fp32 sum).
void embed_bwd_acc_bf16(const int32_t* ids, int64_t n, int64_t hidden, int64_t vocab, const void* dx, void* acc,
                        void* workspace, int64_t workspace_bytes, cudaStream_t st);

// ---------------------------------------------------------------- cross-entropy over fp32 logits
// Per row r < n: row_loss[r] = lse(logits[r]) - logits[r, t] (0 for t == -100). If dlogits (bf16 [n, vocab])
// is given, it receives (softmax - onehot) * grad_scale (zero rows for ignored targets).
// Targets outside [0, vocab) other than -100 set *err to 2. lse (nullable): each row's log-sum-exp (0 if ignored).
void cross_entropy(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float grad_scale,
                   void* dlogits, float* row_loss, int* err, cudaStream_t st, float* lse = nullptr);
// dlogits [n, nv] (bf16) = the columns [v0, v0 + nv) of cross_entropy's dlogits, from those columns' logits [n, nv]
// and each row's lse.
void cross_entropy_slice_grad(const float* logits, const int32_t* targets, int64_t n, int64_t v0, int64_t nv,
                              int64_t vocab, const float* lse, float grad_scale, void* dlogits, cudaStream_t st);
// acc[0] += sum of row_loss[0..n) (fp64, fixed order); acc[1] += number of targets != -100.
void loss_accumulate(const float* row_loss, const int32_t* targets, int64_t n, double* acc, cudaStream_t st);

// ---------------------------------------------------------------- reductions, conversions
// *out += sum of squares of g[0..n) (fp32 data, fp64 accumulation, fixed order). partial: kSumsqBlocks doubles.
constexpr int kSumsqBlocks = 512;
void sumsq_accum(const float* g, int64_t n, double* out, double* partial, cudaStream_t st);
// acc[i] += g[i] for i < n (fp32; gradient accumulation on the device).
void add_f32(float* acc, const float* g, int64_t n, cudaStream_t st);
// acc[i] (bf16) = round-to-nearest-even(acc[i] + g[i]) for i < n (gradients held in bf16).
void add_f32_to_bf16(void* acc, const float* g, int64_t n, cudaStream_t st);
// sumsq_accum over bf16 data.
void sumsq_accum_bf16(const void* g, int64_t n, double* out, double* partial, cudaStream_t st);
void f32_to_bf16(const float* src, int64_t n, void* dst, cudaStream_t st);
void bf16_to_f32(const void* src, int64_t n, float* dst, cudaStream_t st);
// dst[i] = src[rows[i]] rows of `dim` bf16 (gathers rows for generation logits).
void gather_rows(const void* src, const int64_t* rows, int64_t n_rows, int64_t dim, void* dst, cudaStream_t st);

// Backend::adamw_step: one thread per element, the CPU optimizer's fp32 update in round-to-nearest intrinsics (no
// contraction), so bit-identical to cpu::adamw_step (adamw_step.cu). The fields of lt::AdamWStepScalars (kept apart
// here: this header stays C++17).
struct AdamWConsts {
  float decay, w1, beta2, w2, eps, bc2_sqrt, neg_step_size, grad_scale;
};
void adamw_step(const AdamWConsts& s, float* p, uint16_t* hi, uint16_t* lo, const float* g, float* m, float* v,
                int64_t n, cudaStream_t st);

// Backend::adamw_step_q8: the CPU optimizer's scalar 8-bit path (optim::adamw_q8), bit-identical to
// cpu::adamw_step_q8 (adamw_step_q8.cu): one thread block per 256-element quantisation block, one element per
// thread. Scalars: lt::AdamWStepScalars' fields; maps: lt::Q8Maps' layout (kept apart here: C++17).
struct AdamWQ8Consts {
  float beta1, w1, beta2, w2, eps, inv_bc2_sqrt, decay, neg_step_size, grad_scale;
};
struct Q8MapConsts {
  int32_t is_signed, mag_bits;
  float decode[256], top[8], inv_step[8], code_off[8];
};
struct Q8MapsConsts {
  Q8MapConsts m, v;
};
// mq, vq codes and ms, vs the ceil(n / 256) block scales, updated in place; master fp32 p or split hi/lo.
void adamw_step_q8(const AdamWQ8Consts& s, const Q8MapsConsts& maps, float* p, uint16_t* hi, uint16_t* lo,
                   const float* g, uint8_t* mq, uint8_t* vq, float* ms, float* vs, int64_t n, cudaStream_t st);

}  // namespace lt::cuda
