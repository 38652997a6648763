// An in-memory model: config + layout + one flat fp32 buffer per unit (param_layout.h).
// The simple owner used by model I/O, tests and tools; the trainer may keep its own buffers
// (pinned, etc.) with the same layout and use the pointer-based functions of init.h / model_io.h.
#pragma once
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt {

struct ModelWeights {
  ModelConfig config;
  ModelLayout layout;
  std::vector<std::vector<float>> units;  // units[i].size() == layout.units[i].numel (padding is zero)

  size_t num_units() const { return units.size(); }
  float* unit(size_t i) { return units[i].data(); }
  const float* unit(size_t i) const { return units[i].data(); }
  // A tensor by its full HF name ("model.layers.3.mlp.up_proj.weight"); throws lt::Error if absent.
  float* tensor(const std::string& hf_name);
  const float* tensor(const std::string& hf_name) const;
  // The unit index and parameter info of an HF name, or {-1, nullptr}.
  std::pair<int, const ParamInfo*> find(const std::string& hf_name) const;
};

// Zero-filled weights for the config.
ModelWeights make_weights(const ModelConfig& c);

}  // namespace lt
