// ModelConfig: the shape of a decoder-only model, read from an HF config.json
// (Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM) or taken from a preset.
#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace lt {

enum class Arch { Qwen2, Qwen3, Llama };
const char* arch_hf_name(Arch a);  // "Qwen2ForCausalLM", ...

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

  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
};

// Reads <dir>/config.json (or the given .json file). Missing or malformed fields and unsupported
// architectures throw lt::Error naming the file, the field, expected vs actual.
ModelConfig load_model_config(const std::filesystem::path& dir_or_file);
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& source);
// HF-style config.json content (loads in transformers unchanged).
nlohmann::json model_config_to_json(const ModelConfig& c);

// Presets for DESIGN §6 shapes ("qwen2.5-0.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen3-8b", ...).
std::vector<std::string> preset_names();
bool is_preset(const std::string& name);
ModelConfig preset_config(const std::string& name);
// A directory (with config.json), a config.json path, or a preset name.
ModelConfig resolve_model(const std::string& dir_or_preset);

}  // namespace lt
