// Gated DeltaNet kernels of the CUDA backend (Qwen3.5 / Qwen3.6 linear-attention layers, issue #14):
// the depthwise causal conv + SiLU, the fused q/k L2 norm + gates ("prep"), the chunked gated delta rule
// (forward/backward), the gated RMSNorm and the decode step. Semantics: exactly the fp32 CPU reference
// (src/backend/cpu/ops_gdn.h), up to rounding: bf16 in/out, fp32 state and accumulation.
// C++17-clean (included from .cu files and from the backend's C++20 sources).
//
// Conventions (as kernels.h): every launcher enqueues on `st`, checks the launch and never synchronizes;
// "WRITTEN" outputs are overwritten, weight gradients ("+=") are ACCUMULATED in a fixed order (results are
// deterministic run to run). Unsupported shapes throw (LT_CUDA_REQUIRE) with a message naming the limit:
// Dk, Dv multiples of 8 in [8, 128]; K in [1, 8]; Hv % Hk == 0. See gdn_dims_supported().
//
// Chunking of the rule: a FIXED grid of kGdnChunk rows per sample (chunk c of sample b covers rows
// [c*64, min(seq, c*64+64)) of the sample). A segment start inside a chunk is handled by masking (the
// decay products across it are zero), which is the same function as the CPU reference's chunks-restart-
// at-segment-starts (only the rounding differs). So the chunk count never depends on device data.
//
// Additions to the brief's API (no CHANGED signatures so far): kGdnChunk, gdn_dims_supported, GdnRuleImpl,
// gdn_rule_num_chunks; the layout of state_ws is documented at gdn_rule_state_bytes; prep_fwd's v is a
// contiguous copy [T, Hv, Dv].
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernel_options.h"

namespace lt::cuda {

constexpr int64_t kGdnChunk = 64;

// Shapes of one Gated DeltaNet layer call: rows T = batch*seq, sample-major; seg = device int32 [T]
// packed-segment ids or nullptr (one segment per sample). Activations bf16 (void*), weights bf16 (the
// streamed layer copy), weight gradients fp32 ACCUMULATED (+=), everything on stream st.
struct GdnDims {
  int64_t batch = 0, seq = 0;
  int64_t Hk = 0, Hv = 0, Dk = 0, Dv = 0;  // key heads/dim, value heads/dim (Hv % Hk == 0)
  int64_t K = 4;                           // conv kernel
  int64_t tokens() const { return batch * seq; }
  int64_t conv_ch() const { return 2 * Hk * Dk + Hv * Dv; }
};

// True when every kernel below supports d (Dk, Dv % 8 == 0 and <= 128, 1 <= K <= 8, Hv % Hk == 0, ...).
bool gdn_dims_supported(const GdnDims& d);

// Depthwise causal conv + SiLU over [T, C] (C = conv_ch(); x row stride ldx >= C, so it can read a slice
// of a wider projection output), w [C, K]; y [T, C] contiguous. Restarts at sample and segment starts.
void gdn_conv_silu_fwd(const GdnDims& d, const void* x, int64_t ldx, const void* w, const int32_t* seg, void* y,
                       cudaStream_t st);
// dx [T, C] (row stride ldx) WRITTEN; dw [C, K] fp32 +=; workspace: gdn_conv_bwd_workspace_bytes(d).
int64_t gdn_conv_bwd_workspace_bytes(const GdnDims& d);
void gdn_conv_silu_bwd(const GdnDims& d, const void* x, int64_t ldx, const void* w, const void* dy,
                       const int32_t* seg, void* dx, float* dw, void* ws, cudaStream_t st);

// Everything between the conv and the rule, fused: from conv output y [T, C] (q | k | v channels) and the
// projections a, b [T, Hv] (bf16): q, k L2-normalised (eps 1e-6) -> qn, kn [T, Hk, Dk] (bf16), v -> [T, Hv, Dv]
// (bf16, a contiguous COPY of the v channels of y), g = -exp(A_log) softplus(a + dt_bias),
// beta = sigmoid(b) (fp32 [T, Hv]); A_log, dt_bias bf16 [Hv].
// a and b have row stride ldab >= Hv (slices of the layer's one input-projection output).
void gdn_prep_fwd(const GdnDims& d, const void* y, const void* a, const void* b, int64_t ldab, const void* A_log,
                  const void* dt_bias, void* qn, void* kn, void* v, float* g, float* beta, cudaStream_t st);
// Backward of gdn_prep_fwd: from dqn, dkn (fp32 [T,Hk,Dk]), dv (fp32 [T,Hv,Dv]), dg, dbeta (fp32 [T,Hv]):
// dy [T, C] bf16 WRITTEN, da, db [T, Hv] bf16 WRITTEN (row stride ldab, as a and b), dA_log, ddt_bias fp32
// [Hv] +=; workspace: gdn_prep_bwd_workspace_bytes.
int64_t gdn_prep_bwd_workspace_bytes(const GdnDims& d);
void gdn_prep_bwd(const GdnDims& d, const void* y, const void* a, const void* b, int64_t ldab, const void* A_log,
                  const void* dt_bias, const float* dqn, const float* dkn, const float* dv, const float* dg,
                  const float* dbeta, void* dy, void* da, void* db, float* dA_log, float* ddt_bias, void* ws,
                  cudaStream_t st);

// The chunked gated delta rule (chunk 64; WY/UT form as the CPU reference; fp32 state and accumulation;
// q scaled by 1/sqrt(Dk) inside): o [T, Hv, Dv] bf16. state_ws: fp32 chunk-start states for the backward,
// gdn_rule_state_bytes(d) bytes (the backward recomputes nothing it can read from there).
// Layout of state_ws: [batch, gdn_rule_num_chunks(d), Hv, Dk, Dv] fp32, the state at the start of every
// fixed-grid chunk (zero where the chunk starts a sample or a segment).
//
// Three implementations of the rule kernels, same semantics: Chunked (default; per-chunk kernels around serial
// passes that carry only S forward and dL/dS backward, deltanet/rule_{fwd,bwd}_chunked.cu; its forward needs
// the `ws` argument of gdn_rule_fwd, without which the Mma forward runs),
// Mma (one CTA per value tile walks a sample's chunks serially; tensor-core mma.sync bf16 with fp32 accumulation,
// fp32 operands split into bf16 hi + lo, register-resident triangular solves) and Simt (Mma's kernels on fp32
// CUDA cores). KernelOptions::gdn_rule (kernel_options.h; env LT_GDN_RULE=chunked|mma|simt or LT_GDN_SIMT=1)
// selects one (gdn_rule_fwd = Mma, LT_GDN_RULE_FWD=mma, keeps Chunked's backward with the Mma forward). The choice
// is read at each launch; the workspace sizes cover every implementation. Mma and Simt, and the Mma forward under
// Chunked, are comparison variants: the tests check them against each other and bench_deltanet times them.
const char* gdn_rule_impl_name(GdnRuleImpl impl);
GdnRuleImpl gdn_rule_impl();
// Operand precision of the Chunked implementation's tensor-core products (accumulation is fp32 in both, and the
// state is carried in fp32): Bf16 (the default; fp32 operands such as the state, W, U, P rounded to bf16 once per
// product, as flash-linear-attention's kernels do; one mma per fragment pair) or Split (fp32 operands as bf16 hi +
// lo, ~16 mantissa bits, up to three mma). Measured at the 27B shape (H200): Bf16 is within 3.3e-3 (rel.) of Split on
// every output and gradient, rule fwd+bwd 17.5 vs 19.2 ms. Mma and Simt always split.
// KernelOptions::gdn_precision (env LT_GDN_PRECISION=bf16|split); Split is a comparison variant under Chunked.
const char* gdn_rule_precision_name(GdnRulePrecision p);
GdnRulePrecision gdn_rule_precision();
// The Chunked implementation's serial passes in Bf16 precision: register passes (the state in mma accumulators,
// one CTA per value head and sample; deltanet/rule_pass_warp.cu) where the shape allows (Dk 64 or 128, Dv a
// multiple of 16 up to 128), else the tile passes. KernelOptions::gdn_passes = Tile (env LT_GDN_PASS=tile) forces
// the tile passes.
// With the register passes, chunk_grads reads its product operands as bf16 through ldmatrix (S0 / dS staged whole
// as bf16, W from the workspace's bf16 copy; the same rounding as the fragment path). KernelOptions::gdn_grads =
// Frag (env LT_GDN_GRADS=frag) forces the fragment path (fp32 tiles, fragments assembled element by element).
// chunk_grads' CTA size on the bf16 operand path: 256, 384 or 512 threads (255, 168, 128 registers a thread; one
// CTA per SM either way, its shared memory), 512 by default (KernelOptions::gdn_grads_cta, env LT_GDN_GRADS_CTA),
// and its bf16 products in 16 x 32 warp tiles (the default) or 16 x 16 (gdn_grads_tile, env LT_GDN_GRADS_TILE).
// The tile passes, the fragment path and the other CTA sizes and tiles are comparison variants (the tests check
// them, bench_deltanet times them).
int64_t gdn_rule_num_chunks(const GdnDims& d);  // per sample: ceil(seq / kGdnChunk)
int64_t gdn_rule_state_bytes(const GdnDims& d);
// ws: gdn_rule_fwd_workspace_bytes(d) bytes of scratch for the Chunked forward (nullptr: the Mma forward runs).
int64_t gdn_rule_fwd_workspace_bytes(const GdnDims& d);
void gdn_rule_fwd(const GdnDims& d, const void* qn, const void* kn, const void* v, const float* g, const float* beta,
                  const int32_t* seg, void* o, float* state_ws, cudaStream_t st, void* ws = nullptr);
// dO bf16 [T, Hv, Dv] -> dqn, dkn fp32 [T, Hk, Dk] (summed over the value heads sharing a key head), dv fp32
// [T, Hv, Dv], dg, dbeta fp32 [T, Hv], all WRITTEN; workspace gdn_rule_bwd_workspace_bytes(d).
int64_t gdn_rule_bwd_workspace_bytes(const GdnDims& d);
void gdn_rule_bwd(const GdnDims& d, const void* qn, const void* kn, const void* v, const float* g, const float* beta,
                  const int32_t* seg, const float* state_ws, const void* dout, float* dqn, float* dkn, float* dv,
                  float* dg, float* dbeta, void* ws, cudaStream_t st);

// Gated RMSNorm (HF Qwen3_5RMSNormGated) per [row, value head] vector of Dv: out = w * norm(o) * silu(z);
// o [T,Hv,Dv], z [T,Hv*Dv] bf16 of row stride ldz >= Hv*Dv, w bf16 [Dv] (plain weight); rstd fp32 [T*Hv] saved
// for the backward.
void gdn_gated_norm_fwd(const GdnDims& d, const void* o, const void* z, int64_t ldz, const void* w, float eps,
                        void* out, float* rstd, cudaStream_t st);
// do_ bf16 [T,Hv,Dv], dz bf16 WRITTEN (row stride ldz, as z), dw fp32 [Dv] +=; workspace
// gdn_gated_norm_bwd_workspace_bytes.
int64_t gdn_gated_norm_bwd_workspace_bytes(const GdnDims& d);
void gdn_gated_norm_bwd(const GdnDims& d, const void* o, const void* z, int64_t ldz, const void* w, float eps,
                        const float* rstd, const void* dout, void* do_, void* dz, float* dw, void* ws,
                        cudaStream_t st);

// Decoding (one token for each of n sequences; GPU decoding of hybrid models): conv window state
// [slots, C, K-1] (oldest first, as cpu::gdn_conv_silu_step) and recurrent state [slots, Hv, Dk, Dv] fp32,
// both updated in place; zero them at a sequence start. Row r uses slot slots[r] (device int32 [n], distinct
// slots; nullptr: slot r). Per row: y = silu(conv(window, x)) over the q, k, v channels; q, k L2-normalised
// (q also scaled by 1/sqrt(Dk)); g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b);
// S = exp(g) S + k (beta (v - exp(g) S^T k))^T; o = S^T q; then the window shifts in x.
void gdn_decode_step(const GdnDims& d /*batch = n, seq = 1*/, const void* qkv /*[n, C] row stride ldx*/, int64_t ldx,
                     const void* w_conv, const void* a, const void* b, const void* A_log, const void* dt_bias,
                     float* conv_state, float* rec_state, void* o /*[n, Hv, Dv]*/, cudaStream_t st,
                     const int32_t* slots = nullptr);

// Decoding state after a packed prefill pass (GPU decoding of hybrid models). The pass ran the training
// kernels over d = (batch 1, seq T) rows holding n prompts back to back: prompt p is rows
// first(p) .. last_rows[p] (first(0) = 0, first(p) = last_rows[p-1] + 1; device int64 [n]) and goes to batch
// slot slots[p] (device int32 [n]). Inputs: qkv [T, C] (row stride ldx) the pre-conv projections; kn, v,
// g, beta from gdn_prep_fwd; chunk_states gdn_rule_fwd's state_ws. WRITTEN, for each prompt's slot:
//   conv window [C, K-1]: row e-(K-2)+j of qkv in column j (zero where that row precedes the prompt),
//     e = last_rows[p] (cpu::DeltaNetRef::prefill's window);
//   recurrent state [Hv, Dk, Dv]: the state after row e. With c = e / 64 (the fixed-grid chunk of e), start
//     from S = chunk_states[c] when first(p) <= 64 c (the chunk-start state of the prompt's own segment),
//     else from S = 0, and apply the recurrent update S = exp(g_t) S + k_t (beta_t (v_t - exp(g_t) S^T k_t))^T
//     for t = max(first(p), 64 c) .. e (at most 64 rows).
void gdn_prefill_state(const GdnDims& d /*batch = 1, seq = T*/, int64_t n, const int64_t* last_rows,
                       const int32_t* slots, const void* qkv, int64_t ldx, const void* kn, const void* v,
                       const float* g, const float* beta, const float* chunk_states, float* conv_state,
                       float* rec_state, cudaStream_t st);

}  // namespace lt::cuda
