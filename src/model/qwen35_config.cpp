// Qwen3.5 / Qwen3.6 config.json parsing and writing. Field names and defaults follow transformers'
// configuration_qwen3_5.py (Qwen3_5TextConfig, Qwen3_5Config).
#include "model/qwen35_config.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config_fields.h"

namespace lt {

using config_detail::Fields;
using config_detail::json;
using config_detail::shown;

namespace {

// HF accepts legacy spellings (remap_legacy_layer_types) besides the current ones.
bool parse_kind_hf(const std::string& s, LayerKind* k) {
  if (parse_layer_kind(s, k)) return true;
  if (s == "attention") return *k = LayerKind::Attention, true;
  if (s == "mamba" || s == "conv") return *k = LayerKind::GatedDeltaNet, true;
  return false;
}

std::vector<LayerKind> parse_layer_types(const Fields& f, int64_t layers) {
  std::vector<LayerKind> kinds;
  const json* lt = f.get("layer_types");
  if (!lt || lt->is_null()) {
    const int64_t interval = f.opt_int("full_attention_interval", 4);
    LT_CHECK(interval > 0, "{}: field '{}': expected a positive integer, got {}", f.src,
             f.key("full_attention_interval"), interval);
    for (int64_t i = 0; i < layers; ++i)
      kinds.push_back((i + 1) % interval ? LayerKind::GatedDeltaNet : LayerKind::Attention);
    return kinds;
  }
  if (!lt->is_array()) f.bad("layer_types", "list of strings", *lt);
  LT_CHECK(int64_t(lt->size()) == layers, "{}: field '{}': has {} entries, expected num_hidden_layers = {}", f.src,
           f.key("layer_types"), lt->size(), layers);
  for (size_t i = 0; i < lt->size(); ++i) {
    const json& e = (*lt)[i];
    LayerKind k;
    if (!e.is_string() || !parse_kind_hf(e.get<std::string>(), &k))
      fail("{}: field '{}[{}]': got {}, expected \"full_attention\" or \"linear_attention\"", f.src,
           f.key("layer_types"), i, shown(e));
    kinds.push_back(k);
  }
  return kinds;
}

// rope_parameters {rope_type: default, rope_theta, partial_rotary_factor, mrope_section, ...} or the
// older top-level rope_theta / partial_rotary_factor.
void parse_rope35(const Fields& f, ModelConfig& c) {
  c.rope_theta = f.opt_num("rope_theta", 10000.0);
  c.partial_rotary = f.opt_num("partial_rotary_factor", 0.25);
  if (const json* rp = f.get("rope_parameters"); rp && !rp->is_null()) {
    if (!rp->is_object()) f.bad("rope_parameters", "object or null", *rp);
    Fields g{*rp, f.src, f.key("rope_parameters.")};
    const std::string type = g.opt_str("rope_type", g.opt_str("type", "default"));
    LT_CHECK(type == "default", "{}: field '{}': unsupported RoPE type '{}' for qwen3_5 (supported: default)", f.src,
             g.key("rope_type"), type);
    c.rope_theta = g.opt_num("rope_theta", c.rope_theta);
    c.partial_rotary = g.opt_num("partial_rotary_factor", c.partial_rotary);
  }
  LT_CHECK(c.rope_theta > 0, "{}: field '{}': expected a positive number, got {}", f.src, f.key("rope_theta"),
           c.rope_theta);
  LT_CHECK(c.partial_rotary > 0 && c.partial_rotary <= 1, "{}: field '{}': expected a number in (0, 1], got {}", f.src,
           f.key("partial_rotary_factor"), c.partial_rotary);
  LT_CHECK(c.rotary_dim() >= 2, "{}: field '{}': head_dim {} x {} leaves no rotary pair", f.src,
           f.key("partial_rotary_factor"), c.head_dim, c.partial_rotary);
}

void parse_linear(const Fields& f, ModelConfig& c) {
  auto& l = c.linear;
  l.k_heads = f.opt_int("linear_num_key_heads", 16);
  l.v_heads = f.opt_int("linear_num_value_heads", 32);
  l.k_head_dim = f.opt_int("linear_key_head_dim", 128);
  l.v_head_dim = f.opt_int("linear_value_head_dim", 128);
  l.conv_kernel = f.opt_int("linear_conv_kernel_dim", 4);
  for (auto [k, v] : {std::pair{"linear_num_key_heads", l.k_heads}, {"linear_num_value_heads", l.v_heads},
                      {"linear_key_head_dim", l.k_head_dim}, {"linear_value_head_dim", l.v_head_dim},
                      {"linear_conv_kernel_dim", l.conv_kernel}})
    LT_CHECK(v > 0, "{}: field '{}': expected a positive integer, got {}", f.src, f.key(k), v);
  LT_CHECK(l.v_heads % l.k_heads == 0,
           "{}: field '{}': {} is not a multiple of linear_num_key_heads {} (each key head serves whole value heads)",
           f.src, f.key("linear_num_value_heads"), l.v_heads, l.k_heads);
}

}  // namespace

ModelConfig qwen35_config_from_json(const json& top, const std::string& source, std::set<std::string>* fields_read) {
  Fields tf{top, source, "", fields_read};
  std::string arch0;
  if (const json* a = tf.get("architectures"); a && a->is_array() && !a->empty() && (*a)[0].is_string())
    arch0 = (*a)[0].get<std::string>();
  const bool composite = arch0 == "Qwen3_5ForConditionalGeneration" ||
                         (arch0.empty() && tf.opt_str("model_type", "") == "qwen3_5");
  const json* text = &top;
  if (composite) {
    text = tf.get("text_config");
    LT_CHECK(text && text->is_object(),
             "{}: field 'text_config' is missing or not an object (a Qwen3_5ForConditionalGeneration config keeps its "
             "text decoder there)",
             source);
  }
  Fields f{*text, source, composite ? "text_config." : "", fields_read};

  ModelConfig c;
  c.name = source;
  c.arch = Arch::Qwen3_5;
  c.composite = composite;
  if (composite) c.hf_config_text = top.dump(2);
  c.hidden = f.pos_int("hidden_size");
  c.layers = f.pos_int("num_hidden_layers");
  c.heads = f.pos_int("num_attention_heads");
  c.kv_heads = f.opt_int("num_key_value_heads", c.heads);
  LT_CHECK(c.kv_heads > 0 && c.heads % c.kv_heads == 0,
           "{}: field '{}': {} does not divide num_attention_heads {} (grouped-query attention needs whole groups)",
           source, f.key("num_key_value_heads"), c.kv_heads, c.heads);
  c.head_dim = f.opt_int("head_dim", 256);
  LT_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "{}: field '{}': expected a positive even integer, got {}", source,
           f.key("head_dim"), c.head_dim);
  c.ffn = f.pos_int("intermediate_size");
  c.vocab = f.pos_int("vocab_size");
  // transformers ties through the top-level model's config: the composite's own field decides.
  c.tied = composite ? tf.opt_bool("tie_word_embeddings", false) : f.opt_bool("tie_word_embeddings", false);
  LT_CHECK(!f.opt_bool("attention_bias", false),
           "{}: field '{}': attention biases are not supported for qwen3_5 (supported: false)", source,
           f.key("attention_bias"));
  const std::string act = f.opt_str("hidden_act", "silu");
  LT_CHECK(act == "silu" || act == "swish", "{}: field '{}': unsupported activation '{}' (supported: silu)", source,
           f.key("hidden_act"), act);
  c.rms_eps = f.opt_num("rms_norm_eps", 1e-6);
  LT_CHECK(c.rms_eps > 0, "{}: field '{}': expected a positive number, got {}", source, f.key("rms_norm_eps"),
           c.rms_eps);
  c.initializer_range = f.opt_num("initializer_range", 0.02);
  c.max_position = f.opt_int("max_position_embeddings", 32768);
  c.qk_norm = true;
  c.attn_bias = false;
  c.attn_output_gate = true;
  c.norm_plus_one = true;
  parse_rope35(f, c);
  c.rope_scaling.original_max_position_embeddings = c.max_position;
  parse_linear(f, c);
  c.layer_kinds = parse_layer_types(f, c.layers);
  // Token ids live in text_config; older composite configs put them at top level.
  auto tok = [&](const char* k) { return f.get(k) ? f.token_id(k, -1) : tf.token_id(k, -1); };
  c.bos_token_id = tok("bos_token_id");
  c.eos_token_id = tok("eos_token_id");
  c.pad_token_id = tok("pad_token_id");
  return c;
}

json qwen35_config_to_json(const ModelConfig& c) {
  if (c.composite && !c.hf_config_text.empty()) return json::parse(c.hf_config_text);
  json j = config_detail::shape_fields(c);  // architectures / model_type: Qwen3_5ForCausalLM, qwen3_5_text
  j["attention_bias"] = false;
  j["linear_conv_kernel_dim"] = c.linear.conv_kernel;
  j["linear_key_head_dim"] = c.linear.k_head_dim;
  j["linear_value_head_dim"] = c.linear.v_head_dim;
  j["linear_num_key_heads"] = c.linear.k_heads;
  j["linear_num_value_heads"] = c.linear.v_heads;
  json types = json::array();
  for (int64_t i = 0; i < c.layers; ++i) types.push_back(layer_kind_hf_name(c.kind(i)));
  j["layer_types"] = types;
  j["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", c.rope_theta},
                          {"partial_rotary_factor", c.partial_rotary},
                          {"mrope_section", {11, 11, 10}},
                          {"mrope_interleaved", true}};
  auto tok = [](int64_t id) { return id < 0 ? json(nullptr) : json(id); };
  j["bos_token_id"] = tok(c.bos_token_id);
  j["eos_token_id"] = tok(c.eos_token_id);
  j["pad_token_id"] = tok(c.pad_token_id);
  j["dtype"] = "bfloat16";
  j["transformers_version"] = "5.17.0";
  return j;
}

ModelConfig qwen35_preset(const char* name, int64_t hidden, int64_t layers, int64_t heads, int64_t kv, int64_t ffn,
                          int64_t linear_v_heads, bool tied) {
  ModelConfig c;
  c.name = name;
  c.arch = Arch::Qwen3_5;
  c.hidden = hidden;
  c.layers = layers;
  c.heads = heads;
  c.kv_heads = kv;
  c.head_dim = 256;
  c.ffn = ffn;
  c.vocab = 248320;
  c.tied = tied;
  c.qk_norm = true;
  c.attn_output_gate = true;
  c.norm_plus_one = true;
  c.partial_rotary = 0.25;
  c.rope_theta = 1e7;
  c.rms_eps = 1e-6;
  c.max_position = 262144;
  c.rope_scaling.original_max_position_embeddings = c.max_position;
  c.linear = LinearAttnConfig{16, linear_v_heads, 128, 128, 4};
  for (int64_t i = 0; i < layers; ++i)
    c.layer_kinds.push_back((i + 1) % 4 ? LayerKind::GatedDeltaNet : LayerKind::Attention);
  c.bos_token_id = -1;
  c.eos_token_id = 248044;  // <|endoftext|>
  c.pad_token_id = -1;
  return c;
}

}  // namespace lt
