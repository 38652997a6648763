// Batched greedy decoding with a KV cache on the CPU, composed from the op-level reference kernels
// (backend/cpu/ops.h). Prompts are prefilled one by one (causal attention over the prompt), then all
// live sequences advance together one token per step: the projections and the LM head run as one
// GEMM over the batch's rows; attention reads each sequence's own cache.
#pragma once
#include <cstdint>
#include <vector>

#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt::train {

// fp32 weights of every unit (0 = embedding, 1..L = layers, L+1 = head), laid out by `layout`.
struct ModelWeightsView {
  const ModelConfig* cfg = nullptr;
  const ModelLayout* layout = nullptr;
  std::vector<const float*> units;
};

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  int64_t batch_size = 32;           // sequences decoded together
  std::vector<int32_t> stop_ids;     // generation of a sequence ends after emitting one of these
};

// Returns the generated ids of each prompt (stop token included if emitted).
std::vector<std::vector<int32_t>> greedy_generate(const ModelWeightsView& w,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  const GenerateOptions& opt);

// Logits [ids.size(), vocab] of one sequence by a full (non-incremental) forward; for tests.
std::vector<float> forward_logits(const ModelWeightsView& w, const std::vector<int32_t>& ids);

}  // namespace lt::train
