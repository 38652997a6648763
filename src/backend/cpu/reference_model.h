// Whole-model fp32 forward + backward on flat unit buffers (model/param_layout.h):
// embedding -> layers -> head, keeping every boundary activation (no recompute across layers).
// This is the reference the executor's plan-invariance tests compare against.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cpu/reference.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt::cpu {

struct ModelStep {
  double loss = 0;      // loss_sum / n_tokens (0 when every target is ignored)
  double loss_sum = 0;  // sum of per-token losses over non-ignored targets
  int64_t n_tokens = 0;
};

// weights[u] / grads[u]: unit u's flat buffer (size layout.units[u].numel), units in layout order.
// targets are shifted (see shift_labels). Gradients of `loss` (= loss_sum / n_tokens, or of
// loss_sum * loss_scale when loss_scale > 0) are ACCUMULATED (+=) into grads; tied models add the
// LM-head gradient into the embedding's. grads may be empty: forward only.
ModelStep model_forward_backward(const ModelConfig& c, const ModelLayout& layout, const std::vector<const float*>& weights,
                                 const int32_t* ids, const int32_t* targets, const SeqGeometry& g,
                                 const std::vector<float*>& grads, float loss_scale = 0.0f);

// Logits of every row [T, vocab] (small models / tests only: materialises all logits).
void model_logits(const ModelConfig& c, const ModelLayout& layout, const std::vector<const float*>& weights,
                  const int32_t* ids, const SeqGeometry& g, float* logits);

// Convenience owner of one flat buffer per unit.
struct UnitBuffers {
  std::vector<std::vector<float>> units;
  explicit UnitBuffers(const ModelLayout& layout);  // zero-filled
  std::vector<const float*> cptrs() const;
  std::vector<float*> ptrs();
};

}  // namespace lt::cpu
