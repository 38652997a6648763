// ModelConfig: the shape of a decoder-only model, read from an HF config.json
// (Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM, Qwen3_5ForCausalLM and the composite
// Qwen3_5ForConditionalGeneration, whose text decoder is read from `text_config`) or taken from a preset.
#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "model/layer_kind.h"

namespace lt {

enum class Arch { Qwen2, Qwen3, Llama, Qwen3_5 };
const char* arch_hf_name(Arch a);  // "Qwen2ForCausalLM", ..., "Qwen3_5ForCausalLM"

// Gated DeltaNet (linear-attention) shape of Qwen3.5/3.6 (HF linear_* fields).
struct LinearAttnConfig {
  int64_t k_heads = 0;      // linear_num_key_heads
  int64_t v_heads = 0;      // linear_num_value_heads (a multiple of k_heads)
  int64_t k_head_dim = 0;   // linear_key_head_dim
  int64_t v_head_dim = 0;   // linear_value_head_dim
  int64_t conv_kernel = 0;  // linear_conv_kernel_dim
  int64_t key_dim() const { return k_heads * k_head_dim; }
  int64_t value_dim() const { return v_heads * v_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // q, k, v channels of the conv
};

struct RopeScaling {
  std::string type = "none";  // "none" or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string name;  // preset name or directory it was read from
  Arch arch = Arch::Qwen2;
  int64_t hidden = 0;      // hidden_size
  int64_t layers = 0;      // num_hidden_layers
  int64_t heads = 0;       // num_attention_heads
  int64_t kv_heads = 0;    // num_key_value_heads
  int64_t head_dim = 0;    // explicit for Qwen3, hidden/heads otherwise
  int64_t ffn = 0;         // intermediate_size
  int64_t vocab = 0;       // vocab_size
  bool tied = false;       // tie_word_embeddings
  bool attn_bias = false;  // q/k/v projections carry a bias (Qwen2)
  bool qk_norm = false;    // per-head RMSNorm on q and k before RoPE (Qwen3)
  double rms_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double initializer_range = 0.02;
  int64_t max_position = 32768;
  int64_t bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;
  // Qwen3.5/3.6 (all false / 1.0 / empty for the other families):
  bool attn_output_gate = false;    // q_proj also yields a per-head sigmoid gate on the attention output
  double partial_rotary = 1.0;      // fraction of head_dim that RoPE rotates (0.25 in Qwen3.5)
  bool norm_plus_one = false;       // every RMSNorm but the gated one scales by (1 + w), w initialised to 0
  LinearAttnConfig linear;          // shape of the Gated DeltaNet layers
  std::vector<LayerKind> layer_kinds;  // per layer; empty means every layer is Attention
  // Composite checkpoint (Qwen3_5ForConditionalGeneration): text weights are named
  // model.language_model.*, and config.json is kept verbatim (hf_config_text) so that an output
  // directory loads in transformers as the class it came from.
  bool composite = false;
  std::string hf_config_text;       // the config.json this was read from (composite only)

  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
  int64_t rotary_dim() const;       // head_dim * partial_rotary, even
  LayerKind kind(int64_t layer) const {
    return layer_kinds.empty() ? LayerKind::Attention : layer_kinds[size_t(layer)];
  }
  bool hybrid() const;              // some layer is not Attention
  int64_t count(LayerKind k) const; // layers of that kind
  // Prefix of the text decoder's tensor names: "model." or "model.language_model." (composite).
  std::string text_prefix() const { return composite ? "model.language_model." : "model."; }
};

// Reads <dir>/config.json (or the given .json file). Missing or malformed fields and unsupported
// architectures throw lt::Error naming the file, the field, expected vs actual. Fields it does not read
// are ignored (HF configs carry many). fields_read, when given, receives every field the parser looked up
// for this architecture ("text_config.<name>" for a composite config's text decoder).
ModelConfig load_model_config(const std::filesystem::path& dir_or_file);
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& source,
                                   std::set<std::string>* fields_read = nullptr);
// HF-style config.json content (loads in transformers unchanged).
nlohmann::json model_config_to_json(const ModelConfig& c);

// Presets for the supported real model shapes ("qwen2.5-0.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen3-8b", ...).
std::vector<std::string> preset_names();
bool is_preset(const std::string& name);
ModelConfig preset_config(const std::string& name);
// A directory (with config.json), a config.json path, or a preset name.
ModelConfig resolve_model(const std::string& dir_or_preset);

}  // namespace lt
