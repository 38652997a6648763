// Model accounting: bytes and FLOPs per layer at a given batch x seq. Used by
// `model-info`, the planner's cost model, and the metrics (TFLOPS/MFU/HFU).
#pragma once
#include <cstdint>

#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt {

struct LayerCost {
  int64_t params = 0;                  // parameters of one decoder layer
  double flops_fwd = 0;                // matmul + mixer-core FLOPs of one layer forward (causal attention: half of S^2)
  double flops_core_fwd = 0;           // the mixer-core part of flops_fwd (attention scores/PV, or conv + delta rule)
  double flops_bwd = 0;                // backward (2x the forward's matmuls + attention backward)
  int64_t boundary_bytes = 0;          // one boundary activation: tokens * hidden * act_bytes
  int64_t internal_bytes = 0;          // a layer's saved internals for backward (everything but its input boundary)
  int64_t workspace_bytes = 0;         // transient peak inside a layer's forward/backward beyond saved internals
};

// Cost of one decoder layer of kind k (every layer of a kind costs the same). tokens = batch * seq.
// act_bytes: 2 for bf16, 4 for fp32.
LayerCost layer_cost(const ModelConfig& c, LayerKind k, int64_t batch, int64_t seq, int act_bytes = 2);
// Cost of layer `layer` (its kind's).
LayerCost layer_cost_at(const ModelConfig& c, int64_t layer, int64_t batch, int64_t seq, int act_bytes = 2);
// Models whose layers are all alike (throws for hybrid models: use the per-kind forms).
LayerCost layer_cost(const ModelConfig& c, int64_t batch, int64_t seq, int act_bytes = 2);
// Sum over all decoder layers of forward and of backward FLOPs.
struct LayersFlops {
  double fwd = 0, bwd = 0;
};
LayersFlops all_layers_flops(const ModelConfig& c, int64_t batch, int64_t seq);

// 6 * N * tokens, N = all parameters counted once (the paper's and MegaTrain's TFLOPS numerator).
double model_flops_per_step(const ModelConfig& c, int64_t tokens);

// The rows of one step as the attention-inclusive count sees them: tokens, and the sum over every row's
// segments of len^2 (a row that is one segment: seq^2). docs/metrics.md "TFLOPS with attention".
struct StepRows {
  int64_t tokens = 0;
  double sum_sq_len = 0;
};
// `rows` rows of `seq` tokens, each one segment (what the planner assumes: one sample per row).
StepRows full_rows(int64_t rows, int64_t seq);
// Adds one row of `seq` tokens whose segment ids are seg[0..seq) (nullptr: one segment); a new segment
// starts where the id changes.
void add_row(StepRows& r, const int32_t* seg, int64_t seq);
// Forward + backward (3x the forward) FLOPs of the sequence mixers that 6 N leaves out, over all layers:
// causal attention's QK^T and PV, 2 * q_dim * len^2 forward per segment and full-attention layer, and the
// Gated DeltaNet's chunked delta rule at its per-token count (model/mixer_deltanet.cpp), per DeltaNet layer.
double sequence_mixer_flops(const ModelConfig& c, const StepRows& rows);
// 6 * N * tokens + sequence_mixer_flops: the attention-inclusive model FLOPs (PaLM/Megatron convention,
// causal attention counted at half the square).
double model_flops_with_attention(const ModelConfig& c, const StepRows& rows);
// FLOPs of the LM head forward (2 * tokens * hidden * vocab).
double head_flops_fwd(const ModelConfig& c, int64_t tokens);
int64_t parameter_count(const ModelConfig& c);
// Real parameters of one unit (no alignment padding).
int64_t unit_param_count(const UnitLayout& u);
// Transient bytes of the chunked LM head + cross-entropy for one chunk: fp32 logits and their bf16 gradient.
int64_t head_chunk_workspace_bytes(const ModelConfig& c, int64_t chunk_tokens);
// Transient bytes of one head call over `tokens` rows in chunks of `chunk_rows`: the two bf16 copies of the rows'
// hidden state and two fp32 per-row scalars beside the logits chunk (as the CUDA head carves its workspace).
int64_t head_workspace_bytes(const ModelConfig& c, int64_t tokens, int64_t chunk_rows);
// The MLP's rows per pass in a layer call of T rows: the gate/up output and the activation (6 B x ffn a row) are
// carved for this many rows, not T, so that no buffer grows with the sequence times the FFN width. All T up to about
// 1 GiB of them, else T in equal passes under that (long sequences); set_mlp_rows overrides the bound (tests).
int64_t mlp_pass_rows(const ModelConfig& c, int64_t T, int64_t bound = 0);
// The bound of mlp_pass_rows: 1 GiB / (6 B x ffn) in multiples of 256 rows, at least 1,024.
int64_t mlp_pass_bound(const ModelConfig& c);

// The vocabulary rows of one slice of the LM head's weight gradient (StatePlacement::head_grad_slices): its fp32
// buffer of rows x hidden is at most 256 MiB, rows a multiple of 256 (or the whole vocabulary).
int64_t head_grad_slice_rows(const ModelConfig& c);

}  // namespace lt
