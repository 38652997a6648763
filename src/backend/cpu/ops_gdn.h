// fp32 CPU reference ops of the Gated DeltaNet token mixer of Qwen3.5/Qwen3.6 (HF transformers
// modeling_qwen3_5.py, Qwen3_5GatedDeltaNet): the depthwise causal conv1d + SiLU, the q/k L2 norm, the
// decay/beta gates, the gated RMSNorm of the output, and the gated delta rule itself (naive recurrence,
// the chunked WY/UT-transform form used for training, and their backward passes).
//
// Conventions (as ops.h): row-major; "_fwd" WRITES outputs; "_bwd" WRITES input gradients and
// ACCUMULATES (+=) parameter gradients in row order, so splitting the rows into consecutive calls on
// sequence boundaries gives bit-identical results. Cumulative log-decays, the g/beta scalar sums and the conv accumulate in double; chunk products in fp32 in a fixed order. Results do not
// depend on the OpenMP thread count.
//
// Sequences: every op that mixes rows works on ONE sequence of S rows. seg is nullptr (one segment) or
// int32[S] segment ids of packed samples: a new segment starts at row t when seg[t] != seg[t-1], and
// nothing flows across a segment start (the conv window and the recurrent state restart from zero).
#pragma once
#include <cstdint>

namespace lt::cpu {

// ---------------------------------------------------------------- Causal depthwise conv1d + SiLU
// HF causal_conv1d_fn(activation="silu", bias=None). x [S, C], w [C, K] (conv1d.weight [C,1,K]):
//   pre[t,c] = sum_{i<K} w[c,i] * x[t-(K-1)+i, c]   (rows before 0 or before t's segment start are 0)
//   y = silu(pre).
void gdn_conv_silu_fwd(const float* x, const float* w, int64_t S, int64_t C, int64_t K, const int32_t* seg,
                       float* y);
// dx [S, C] written; dw [C, K] += (row order).
void gdn_conv_silu_bwd(const float* x, const float* w, const float* dy, int64_t S, int64_t C, int64_t K,
                       const int32_t* seg, float* dx, float* dw);
// One decode step (HF causal_conv1d_update): state [C, K-1] holds the last K-1 inputs of each channel,
// oldest first (zeros at the start of a sequence); y_t = silu(conv of [state, x_t]); state is shifted
// by one and x_t appended. Bit-identical to row t of gdn_conv_silu_fwd.
void gdn_conv_silu_step(const float* x_t, const float* w, int64_t C, int64_t K, float* state, float* y_t);

// ---------------------------------------------------------------- L2 norm (q/k of the delta rule)
// HF l2norm: y = x * rsqrt(sum(x^2) + eps) per vector of length D (eps = 1e-6 in the layer).
void gdn_l2norm_fwd(const float* x, int64_t n_vec, int64_t D, float eps, float* y);
void gdn_l2norm_bwd(const float* x, const float* dy, int64_t n_vec, int64_t D, float eps, float* dx);

// ---------------------------------------------------------------- Gates
// Per row t and value head h (a, b, g, beta are [S, Hv]):
//   g = -exp(A_log[h]) * softplus(a[t,h] + dt_bias[h])   (torch softplus: identity above 20)
//   beta = sigmoid(b[t,h])
void gdn_gates_fwd(const float* a, const float* b, const float* A_log, const float* dt_bias, int64_t S, int64_t Hv,
                   float* g, float* beta);
// da, db written; dA_log, ddt_bias += (row order).
void gdn_gates_bwd(const float* a, const float* b, const float* A_log, const float* dt_bias, const float* dg,
                   const float* dbeta, int64_t S, int64_t Hv, float* da, float* db, float* dA_log, float* ddt_bias);

// ---------------------------------------------------------------- Gated RMSNorm
// HF Qwen3_5RMSNormGated per vector of length D: y = w * (x * rsqrt(mean(x^2) + eps)) * silu(z), w [D]
// (the plain weight, not 1 + w).
void gdn_gated_rmsnorm_fwd(const float* x, const float* z, const float* w, int64_t n_vec, int64_t D, float eps,
                           float* y);
// dx, dz written; dw += (vector order).
void gdn_gated_rmsnorm_bwd(const float* x, const float* z, const float* w, const float* dy, int64_t n_vec, int64_t D,
                           float eps, float* dx, float* dz, float* dw);

// ---------------------------------------------------------------- Gated delta rule
// q, k [S, Hk, Dk] (already L2-normalised, not yet scaled), v [S, Hv, Dv], g, beta [S, Hv], o [S, Hv, Dv].
// Value head h reads key head h / (Hv/Hk) (HF repeat_interleave). Per value head, with scale =
// 1/sqrt(Dk), q~ = scale * q and the state S_h [Dk, Dv] starting at 0 (and at every segment start):
//   S'  = exp(g_t) S_{t-1}
//   S_t = S' + beta_t k_t (v_t - S'^T k_t)^T
//   o_t = S_t^T q~_t
// chunk is the chunk length of the chunked form (ignored by the recurrent functions). Chunks start at
// every segment start and then every `chunk` rows; the last chunk of a segment may be short.
struct GdnShape {
  int64_t S = 0, Hk = 0, Hv = 0, Dk = 0, Dv = 0;
  int64_t chunk = 64;
};

// Number of chunks of the chunked form (the first dimension of chunk_states).
int64_t gdn_rule_num_chunks(const GdnShape& s, const int32_t* seg);

// Naive token-by-token recurrence (the test oracle).
void gdn_rule_recurrent_fwd(const GdnShape& s, const float* q, const float* k, const float* v, const float* g,
                            const float* beta, const int32_t* seg, float* o);
// BPTT through the recurrence (stores the per-token states of one head: O(S Dk Dv) memory; the oracle of
// the chunked backward). dq, dk [S, Hk, Dk] (summed over the value heads of a key head), dv, dg, dbeta
// WRITTEN.
void gdn_rule_recurrent_bwd(const GdnShape& s, const float* q, const float* k, const float* v, const float* g,
                            const float* beta, const int32_t* seg, const float* dout, float* dq, float* dk, float* dv,
                            float* dg, float* dbeta);
// One decode token on an explicit state [Hv, Dk, Dv] (updated in place): q_t, k_t [Hk, Dk], v_t [Hv, Dv],
// g_t, beta_t [Hv], o_t [Hv, Dv]. Bit-identical to one row of gdn_rule_recurrent_fwd.
void gdn_rule_step(const float* q_t, const float* k_t, const float* v_t, const float* g_t, const float* beta_t,
                   int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, float* state, float* o_t);

// Chunked form (Gated DeltaNet, Yang, Kautz & Hatamizadeh, ICLR 2025; HF torch_chunk_gated_delta_rule).
// chunk_states (optional, may be nullptr) receives the state at the start of every chunk,
// [gdn_rule_num_chunks, Hv, Dk, Dv] (zero for the first chunk of each segment), for the backward.
// Memory beyond inputs/outputs: O(chunk^2 + chunk (Dk + Dv) + Dk Dv) per head.
void gdn_rule_chunked_fwd(const GdnShape& s, const float* q, const float* k, const float* v, const float* g,
                          const float* beta, const int32_t* seg, float* o, float* chunk_states);
// Backward of the chunked form given dout [S, Hv, Dv]; chunk_states from the forward (recomputed when
// nullptr). dq, dk [S, Hk, Dk] (summed over the value heads of a key head), dv, dg, dbeta WRITTEN.
// The math of every step is stated in ops_gdn_rule_bwd.cpp.
void gdn_rule_chunked_bwd(const GdnShape& s, const float* q, const float* k, const float* v, const float* g,
                          const float* beta, const int32_t* seg, const float* chunk_states, const float* dout,
                          float* dq, float* dk, float* dv, float* dg, float* dbeta);

}  // namespace lt::cpu
