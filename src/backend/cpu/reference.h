// CPU fp32 reference of the model, at the granularity the executor streams:
// embedding, one decoder layer, and the head (final norm + LM head + cross-entropy).
// The CPU backend runs these; the CUDA kernels are tested against them.
//
// Conventions (shared by every backend; the sequence ones are in model/sequence.h):
//  * Weights of a unit are one flat fp32 buffer laid out by model/param_layout.h (UnitLayout offsets).
//  * layer_backward recomputes the layer's internals from its input x (no saved internals needed)
//    and ACCUMULATES weight gradients into dw (+=). Cross-sample reductions (weight gradients,
//    loss sums) are accumulated sample by sample in sample order, so results are bit-identical
//    however the executor groups samples into chunks.
#pragma once
#include <cstdint>

#include "model/model_config.h"
#include "model/param_layout.h"
#include "model/sequence.h"

namespace lt::cpu {

// The sequence conventions (model/sequence.h), under the names the backends use.
using lt::kIgnoreIndex;
using lt::SeqGeometry;
using lt::shift_labels;

void embed_forward(const ModelConfig& c, const float* emb, const int32_t* ids, int64_t T, float* x);
void embed_backward(const ModelConfig& c, const int32_t* ids, int64_t T, const float* dx, float* demb);

// y may alias x; dx may alias dy (each sample's rows are read before they are written).
void layer_forward(const ModelConfig& c, const UnitLayout& lay, const float* w, const SeqGeometry& g,
                   const float* x, float* y);
void layer_backward(const ModelConfig& c, const UnitLayout& lay, const float* w, const SeqGeometry& g,
                    const float* x, const float* dy, float* dx, float* dw);

// Final RMSNorm + LM head + cross-entropy, chunked over tokens so that full logits never exist.
// lm_w is lm_head.weight, or the embedding matrix when tied. Returns the SUM of per-token losses over
// non-ignored targets. If dx != nullptr, also computes gradients of (loss_sum * loss_scale): writes dx,
// and accumulates (+=) into d_head_w (the head unit's flat gradient) and d_lm_w.
struct HeadResult {
  double loss_sum = 0;
  int64_t n_tokens = 0;  // non-ignored targets
};
HeadResult head_forward_backward(const ModelConfig& c, const UnitLayout& head_lay, const float* head_w,
                                 const float* lm_w, const int32_t* targets, int64_t T, const float* x,
                                 float loss_scale, float* dx, float* d_head_w, float* d_lm_w, int64_t seq = 0);
// head_forward_backward without the LM weight's gradient: d_norm_w accumulates the final norm's (hidden elements),
// lse (nullable) receives each row's log-sum-exp (0 for rows without a target, or in chunks without any).
HeadResult head_forward_lse(const ModelConfig& c, const UnitLayout& head_lay, const float* head_w, const float* lm_w,
                            const int32_t* targets, int64_t T, const float* x, float loss_scale, float* dx,
                            float* d_norm_w, float* lse, int64_t seq = 0);
// dw[n_v, hidden] += rows v0 .. v0+n_v-1 of the d_lm_w head_forward_backward accumulates for the same rows (the same
// token chunks and summation order), from those columns' logits computed again and head_forward_lse's lse.
void head_lm_grad_slice(const ModelConfig& c, const UnitLayout& head_lay, const float* head_w, const float* lm_w,
                        const int32_t* targets, int64_t T, const float* x, const float* lse, float loss_scale,
                        int64_t v0, int64_t n_v, float* dw, int64_t seq = 0);
// Token chunking of the head: every sample (seq > 0: rows b*seq..; seq == 0: all T rows as one sample)
// is split into equal chunks of at most head_chunk_rows(vocab) rows (~320 MiB of logits). The chunks
// depend only on the sample's length, so d_lm_w is bit-identical however samples are grouped into calls
// (pass SeqGeometry::seq), and one call per sample with seq == 0 equals one call with seq given.
int64_t head_chunk_rows(int64_t vocab);
// Overrides head_chunk_rows() for every vocab (tests, benchmarks); 0 restores the automatic choice.
void set_head_chunk_rows(int64_t rows);
// Logits of chosen rows (generation): out [n_rows, vocab].
void head_logits(const ModelConfig& c, const UnitLayout& head_lay, const float* head_w, const float* lm_w,
                 const float* x, const int64_t* rows, int64_t n_rows, float* out);

}  // namespace lt::cpu
