// Qwen3.5 / Qwen3.6 (HF model_type qwen3_5 / qwen3_5_text) config.json <-> ModelConfig. The hybrid
// family: Gated DeltaNet layers and gated full-attention layers in the order `layer_types` gives.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/model_config.h"

namespace lt {

// `j` is the whole config.json: a Qwen3_5ForCausalLM text config, or a composite
// Qwen3_5ForConditionalGeneration config whose decoder is under `text_config`. fields_read: as for
// model_config_from_json.
ModelConfig qwen35_config_from_json(const nlohmann::json& j, const std::string& source,
                                    std::set<std::string>* fields_read = nullptr);
// Text config (Qwen3_5ForCausalLM), or for a composite config the text it was read from.
nlohmann::json qwen35_config_to_json(const ModelConfig& c);
// Preset of the family: hidden, layers (every 4th full attention), heads/kv heads, ffn, linear value
// heads, tied; the rest is the family's (docs/model.md names the source of each preset).
ModelConfig qwen35_preset(const char* name, int64_t hidden, int64_t layers, int64_t heads, int64_t kv, int64_t ffn,
                          int64_t linear_v_heads, bool tied);

}  // namespace lt
