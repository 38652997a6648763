// HF config.json <-> ModelConfig, and the built-in presets.
#include "model/model_config.h"

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "model/config_fields.h"
#include "model/qwen35_config.h"

namespace lt {

using config_detail::Fields;
using config_detail::json;
using config_detail::shown;
using config_detail::type_name;

const char* arch_hf_name(Arch a) {
  switch (a) {
    case Arch::Qwen2: return "Qwen2ForCausalLM";
    case Arch::Qwen3: return "Qwen3ForCausalLM";
    case Arch::Llama: return "LlamaForCausalLM";
    case Arch::Qwen3_5: return "Qwen3_5ForCausalLM";
  }
  return "?";
}

int64_t ModelConfig::rotary_dim() const {
  // transformers: dim = int(head_dim * partial_rotary_factor); inv_freq over arange(0, dim, 2).
  return int64_t(double(head_dim) * partial_rotary) / 2 * 2;
}

bool ModelConfig::hybrid() const {
  for (LayerKind k : layer_kinds)
    if (k != LayerKind::Attention) return true;
  return false;
}

int64_t ModelConfig::count(LayerKind k) const {
  if (layer_kinds.empty()) return k == LayerKind::Attention ? layers : 0;
  int64_t n = 0;
  for (LayerKind x : layer_kinds) n += x == k;
  return n;
}

namespace {

const char* arch_model_type(Arch a) {
  switch (a) {
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
    case Arch::Llama: return "llama";
    case Arch::Qwen3_5: return "qwen3_5_text";
  }
  return "?";
}

constexpr const char* kSupportedArchs =
    "Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration";

Arch parse_arch(const Fields& f) {
  static const std::map<std::string, Arch> by_class = {
      {"Qwen2ForCausalLM", Arch::Qwen2},   {"Qwen3ForCausalLM", Arch::Qwen3},
      {"LlamaForCausalLM", Arch::Llama},   {"Qwen3_5ForCausalLM", Arch::Qwen3_5},
      {"Qwen3_5ForConditionalGeneration", Arch::Qwen3_5}};
  static const std::map<std::string, Arch> by_type = {{"qwen2", Arch::Qwen2},
                                                      {"qwen3", Arch::Qwen3},
                                                      {"llama", Arch::Llama},
                                                      {"qwen3_5", Arch::Qwen3_5},
                                                      {"qwen3_5_text", Arch::Qwen3_5}};
  bool have = false;
  Arch arch = Arch::Qwen2;
  if (auto* a = f.get("architectures"); a && !a->is_null()) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      f.bad("architectures", "a non-empty list of strings", *a);
    auto name = (*a)[0].get<std::string>();
    auto it = by_class.find(name);
    LT_CHECK(it != by_class.end(), "{}: field 'architectures': unsupported architecture '{}' (supported: {})", f.src,
             name, kSupportedArchs);
    arch = it->second;
    have = true;
  }
  if (auto* t = f.get("model_type"); t && !t->is_null()) {
    if (!t->is_string()) f.bad("model_type", "string", *t);
    auto name = t->get<std::string>();
    auto it = by_type.find(name);
    LT_CHECK(it != by_type.end(), "{}: field 'model_type': unsupported model type '{}' (supported: qwen2, qwen3, llama, qwen3_5, qwen3_5_text)",
             f.src, name);
    LT_CHECK(!have || it->second == arch, "{}: field 'model_type' is '{}' but 'architectures' names {}", f.src, name,
             arch_hf_name(arch));
    arch = it->second;
    have = true;
  }
  LT_CHECK(have, "{}: neither 'architectures' nor 'model_type' is present (supported: {})", f.src, kSupportedArchs);
  return arch;
}

// RoPE: transformers 5.x writes `rope_parameters` {rope_type, rope_theta, ...}; older configs write
// `rope_theta` at top level and `rope_scaling` {type|rope_type, ...} (null when plain RoPE).
void parse_rope(const Fields& f, ModelConfig& c) {
  c.rope_theta = f.opt_num("rope_theta", 10000.0);
  const json* rs = nullptr;
  const char* key = "rope_scaling";
  if (auto* p = f.get("rope_parameters"); p && !p->is_null()) {
    rs = p;
    key = "rope_parameters";
  } else if (auto* s = f.get("rope_scaling"); s && !s->is_null()) {
    rs = s;
  }
  c.rope_scaling = RopeScaling{};
  c.rope_scaling.original_max_position_embeddings = c.max_position;
  if (!rs) return;
  if (!rs->is_object()) f.bad(key, "object or null", *rs);
  Fields g{*rs, f.src};
  std::string type = g.opt_str("rope_type", g.opt_str("type", "default"));
  auto sub = [&](const char* k) { return std::string(key) + "." + k; };
  if (rs->contains("rope_theta")) {
    const json& v = (*rs)["rope_theta"];
    if (!v.is_number()) fail("{}: field '{}': expected number, got {} {}", f.src, sub("rope_theta"), type_name(v), shown(v));
    c.rope_theta = v.get<double>();
  }
  if (type == "default") return;
  LT_CHECK(type == "llama3",
           "{}: field '{}': unsupported RoPE type '{}' (supported: default, llama3)", f.src, sub("rope_type"), type);
  auto num = [&](const char* k, double dflt) {
    auto it = rs->find(k);
    if (it == rs->end() || it->is_null()) return dflt;
    if (!it->is_number()) fail("{}: field '{}': expected number, got {} {}", f.src, sub(k), type_name(*it), shown(*it));
    return it->get<double>();
  };
  auto& r = c.rope_scaling;
  r.type = "llama3";
  auto need = [&](const char* k) {
    LT_CHECK(rs->contains(k), "{}: field '{}' is required for RoPE type llama3", f.src, sub(k));
  };
  need("factor");
  r.factor = num("factor", 1.0);
  r.low_freq_factor = num("low_freq_factor", 1.0);
  r.high_freq_factor = num("high_freq_factor", 4.0);
  double omp = num("original_max_position_embeddings", static_cast<double>(c.max_position));
  LT_CHECK(omp == std::trunc(omp) && omp > 0 && omp < 9.0e18, "{}: field '{}': expected a positive integer, got {}",
           f.src, sub("original_max_position_embeddings"), omp);
  r.original_max_position_embeddings = static_cast<int64_t>(omp);
  LT_CHECK(r.factor >= 1.0, "{}: field '{}': expected >= 1, got {}", f.src, sub("factor"), r.factor);
  LT_CHECK(r.high_freq_factor > r.low_freq_factor, "{}: field '{}' ({}) must exceed '{}' ({})", f.src,
           sub("high_freq_factor"), r.high_freq_factor, sub("low_freq_factor"), r.low_freq_factor);
  LT_CHECK(r.original_max_position_embeddings > 0, "{}: field '{}': expected a positive integer, got {}", f.src,
           sub("original_max_position_embeddings"), omp);
}

void reject_sliding_window(const Fields& f) {
  if (f.opt_bool("use_sliding_window", false))
    fail("{}: field 'use_sliding_window': sliding-window attention is not supported (supported: false, full causal "
         "attention in every layer)",
         f.src);
  if (auto* lt = f.get("layer_types"); lt && !lt->is_null()) {
    if (!lt->is_array()) f.bad("layer_types", "list of strings", *lt);
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& e = (*lt)[i];
      if (!e.is_string() || e.get<std::string>() != "full_attention")
        fail("{}: field 'layer_types[{}]': got {}, only \"full_attention\" is supported", f.src, i, shown(e));
    }
  }
}

}  // namespace

ModelConfig model_config_from_json(const json& j, const std::string& source, std::set<std::string>* fields_read) {
  LT_CHECK(j.is_object(), "{}: expected a JSON object at top level, got {}", source, type_name(j));
  Fields f{j, source, "", fields_read};
  ModelConfig c;
  c.name = source;
  c.arch = parse_arch(f);
  if (c.arch == Arch::Qwen3_5) return qwen35_config_from_json(j, source, fields_read);

  c.hidden = f.pos_int("hidden_size");
  c.layers = f.pos_int("num_hidden_layers");
  c.heads = f.pos_int("num_attention_heads");
  c.kv_heads = f.opt_int("num_key_value_heads", c.heads);
  c.ffn = f.pos_int("intermediate_size");
  c.vocab = f.pos_int("vocab_size");
  LT_CHECK(c.kv_heads > 0, "{}: field 'num_key_value_heads': expected a positive integer, got {}", source, c.kv_heads);
  LT_CHECK(c.heads % c.kv_heads == 0,
           "{}: field 'num_key_value_heads': {} does not divide num_attention_heads {} (grouped-query attention needs "
           "whole groups)",
           source, c.kv_heads, c.heads);

  // Qwen3 carries an explicit head_dim (default 128 in transformers); Qwen2 and Llama use one when
  // present (non-null, non-zero; transformers' modeling code does the same) and hidden/heads otherwise.
  if (c.arch == Arch::Qwen3) {
    c.head_dim = f.opt_int("head_dim", 128);
  } else {
    c.head_dim = f.opt_int("head_dim", 0);
    if (c.head_dim == 0) {
      LT_CHECK(c.hidden % c.heads == 0, "{}: field 'hidden_size' {} is not a multiple of num_attention_heads {}", source,
               c.hidden, c.heads);
      c.head_dim = c.hidden / c.heads;
    }
  }
  LT_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "{}: field 'head_dim': expected a positive even integer, got {}",
           source, c.head_dim);

  c.tied = f.opt_bool("tie_word_embeddings", false);
  c.qk_norm = c.arch == Arch::Qwen3;
  // Qwen2 hard-codes q/k/v bias; Qwen3 and Llama read attention_bias (default false).
  c.attn_bias = c.arch == Arch::Qwen2 ? true : f.opt_bool("attention_bias", false);
  if (c.arch == Arch::Llama && f.opt_bool("mlp_bias", false))
    fail("{}: field 'mlp_bias': MLP biases are not supported (supported: false)", source);
  if (c.arch == Arch::Llama) {
    int64_t tp = f.opt_int("pretraining_tp", 1);
    LT_CHECK(tp == 1, "{}: field 'pretraining_tp': only 1 is supported, got {}", source, tp);
  }

  std::string act = f.opt_str("hidden_act", "silu");
  // transformers maps "swish" to the same SiLU module.
  LT_CHECK(act == "silu" || act == "swish", "{}: field 'hidden_act': unsupported activation '{}' (supported: silu)",
           source, act);
  const double prf = f.opt_num("partial_rotary_factor", 1.0);
  LT_CHECK(prf == 1.0, "{}: field 'partial_rotary_factor': only 1.0 (RoPE over the whole head) is supported, got {}",
           source, prf);
  // Dropout only acts in HF's training mode; lazytrain never applies it, so say so rather than refuse.
  if (const double drop = f.opt_num("attention_dropout", 0.0); drop != 0.0)
    log_warn("{}: attention_dropout {} is ignored (lazytrain trains without dropout)", source, drop);
  reject_sliding_window(f);

  c.rms_eps = f.opt_num("rms_norm_eps", 1e-6);
  LT_CHECK(c.rms_eps > 0, "{}: field 'rms_norm_eps': expected a positive number, got {}", source, c.rms_eps);
  c.initializer_range = f.opt_num("initializer_range", 0.02);
  c.max_position = f.opt_int("max_position_embeddings", c.arch == Arch::Llama ? 2048 : 32768);
  parse_rope(f, c);
  LT_CHECK(c.rope_theta > 0, "{}: field 'rope_theta': expected a positive number, got {}", source, c.rope_theta);

  const bool llama = c.arch == Arch::Llama;
  c.bos_token_id = f.token_id("bos_token_id", llama ? 1 : -1);
  c.eos_token_id = f.token_id("eos_token_id", llama ? 2 : -1);
  c.pad_token_id = f.token_id("pad_token_id", -1);
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& dir_or_file) {
  namespace fs = std::filesystem;
  fs::path file = dir_or_file;
  if (fs::is_directory(file)) file /= "config.json";
  std::ifstream in(file);
  LT_CHECK(in.good(), "{}: cannot open model config (expected a model directory with config.json or a .json file)",
           file.string());
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    fail("{}: invalid JSON: {}", file.string(), e.what());
  }
  ModelConfig c = model_config_from_json(j, file.string());
  c.name = dir_or_file.string();
  return c;
}

namespace config_detail {
json shape_fields(const ModelConfig& c) {
  json j;
  j["architectures"] = json::array({arch_hf_name(c.arch)});
  j["model_type"] = arch_model_type(c.arch);
  j["hidden_size"] = c.hidden;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_heads;
  j["head_dim"] = c.head_dim;
  j["intermediate_size"] = c.ffn;
  j["vocab_size"] = c.vocab;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position;
  j["initializer_range"] = c.initializer_range;
  j["rms_norm_eps"] = c.rms_eps;
  j["tie_word_embeddings"] = c.tied;
  j["use_cache"] = true;
  j["attention_dropout"] = 0.0;
  return j;
}
}  // namespace config_detail

json model_config_to_json(const ModelConfig& c) {
  if (c.arch == Arch::Qwen3_5) return qwen35_config_to_json(c);
  json j = config_detail::shape_fields(c);
  if (c.arch != Arch::Qwen2) j["attention_bias"] = c.attn_bias;
  if (c.arch == Arch::Llama) {
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  if (c.arch != Arch::Llama) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.layers;
  }
  // Both spellings of RoPE: `rope_parameters` (transformers >= 5) and rope_theta/rope_scaling (4.x).
  j["rope_theta"] = c.rope_theta;
  json rp = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
  if (c.rope_scaling.type == "llama3") {
    json rs = {{"rope_type", "llama3"},
               {"factor", c.rope_scaling.factor},
               {"low_freq_factor", c.rope_scaling.low_freq_factor},
               {"high_freq_factor", c.rope_scaling.high_freq_factor},
               {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
    rp = rs;
    rp["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = rs;
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rope_parameters"] = rp;
  auto tok = [](int64_t id) { return id < 0 ? json(nullptr) : json(id); };
  j["bos_token_id"] = tok(c.bos_token_id);
  j["eos_token_id"] = tok(c.eos_token_id);
  j["pad_token_id"] = tok(c.pad_token_id);
  j["torch_dtype"] = "bfloat16";
  j["dtype"] = "bfloat16";
  j["transformers_version"] = "4.51.0";
  return j;
}

// ---------------------------------------------------------------------------------------------
// Presets. Real shapes of the supported model families (+ 64/80-layer shapes for planner benchmarks) and tiny
// ones for tests and the demo.

namespace {

// The fields every preset sets from its shape; the family functions below add the rest.
ModelConfig preset_shape(const char* name, Arch arch, int64_t hidden, int64_t layers, int64_t heads, int64_t kv,
                         int64_t ffn, int64_t vocab, bool tied) {
  ModelConfig c;
  c.name = name;
  c.arch = arch;
  c.hidden = hidden;
  c.layers = layers;
  c.heads = heads;
  c.kv_heads = kv;
  c.head_dim = hidden / heads;
  c.ffn = ffn;
  c.vocab = vocab;
  c.tied = tied;
  c.qk_norm = false;
  return c;
}

ModelConfig qwen2_shape(const char* name, int64_t hidden, int64_t layers, int64_t heads, int64_t kv, int64_t ffn,
                        int64_t vocab, bool tied, double theta = 1000000.0) {
  ModelConfig c = preset_shape(name, Arch::Qwen2, hidden, layers, heads, kv, ffn, vocab, tied);
  c.attn_bias = true;
  c.rms_eps = 1e-6;
  c.rope_theta = theta;
  c.max_position = 32768;
  c.rope_scaling.original_max_position_embeddings = c.max_position;
  c.bos_token_id = 151643;
  c.eos_token_id = 151643;
  c.pad_token_id = -1;
  return c;
}

ModelConfig qwen3_shape(const char* name, int64_t hidden, int64_t layers, int64_t heads, int64_t kv, int64_t head_dim,
                        int64_t ffn, int64_t vocab, bool tied) {
  ModelConfig c = qwen2_shape(name, hidden, layers, heads, kv, ffn, vocab, tied);
  c.arch = Arch::Qwen3;
  c.head_dim = head_dim;
  c.attn_bias = false;
  c.qk_norm = true;
  c.max_position = 40960;
  c.rope_scaling.original_max_position_embeddings = c.max_position;
  c.eos_token_id = 151645;
  return c;
}

ModelConfig llama3_shape(const char* name, int64_t hidden, int64_t layers, int64_t heads, int64_t kv, int64_t ffn,
                         int64_t vocab, bool tied) {
  ModelConfig c = preset_shape(name, Arch::Llama, hidden, layers, heads, kv, ffn, vocab, tied);
  c.attn_bias = false;
  c.rms_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.max_position = 131072;
  c.rope_scaling = RopeScaling{"llama3", 8.0, 1.0, 4.0, 8192};  // Llama 3.1; 3.2 uses factor 32
  c.bos_token_id = 128000;
  c.eos_token_id = 128001;
  return c;
}

struct Preset {
  const char* name;
  ModelConfig (*make)();
};

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"qwen2.5-0.5b", [] { return qwen2_shape("qwen2.5-0.5b", 896, 24, 14, 2, 4864, 151936, true); }},
      {"qwen2.5-1.5b", [] { return qwen2_shape("qwen2.5-1.5b", 1536, 28, 12, 2, 8960, 151936, true); }},
      {"qwen2.5-3b", [] { return qwen2_shape("qwen2.5-3b", 2048, 36, 16, 2, 11008, 151936, true); }},
      {"qwen2.5-7b", [] { return qwen2_shape("qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, false); }},
      {"qwen2.5-14b", [] { return qwen2_shape("qwen2.5-14b", 5120, 48, 40, 8, 13824, 152064, false); }},
      {"qwen2.5-32b", [] { return qwen2_shape("qwen2.5-32b", 5120, 64, 40, 8, 27648, 152064, false); }},
      {"qwen2.5-72b", [] { return qwen2_shape("qwen2.5-72b", 8192, 80, 64, 8, 29568, 152064, false); }},
      {"qwen3-0.6b", [] { return qwen3_shape("qwen3-0.6b", 1024, 28, 16, 8, 128, 3072, 151936, true); }},
      {"qwen3-8b", [] { return qwen3_shape("qwen3-8b", 4096, 36, 32, 8, 128, 12288, 151936, false); }},
      {"llama3.1-8b", [] { return llama3_shape("llama3.1-8b", 4096, 32, 32, 8, 14336, 128256, false); }},
      {"llama3.2-1b",
       [] {
         auto c = llama3_shape("llama3.2-1b", 2048, 16, 32, 8, 8192, 128256, true);
         c.rope_scaling.factor = 32.0;
         return c;
       }},
      // Qwen3.5 / Qwen3.6 text decoders (hybrid: every 4th layer full attention); docs/model.md names the
      // published config.json each comes from.
      {"qwen3.6-27b", [] { return qwen35_preset("qwen3.6-27b", 5120, 64, 24, 4, 17408, 48, false); }},
      {"qwen3.5-27b", [] { return qwen35_preset("qwen3.5-27b", 5120, 64, 24, 4, 17408, 48, false); }},
      {"qwen3.5-9b", [] { return qwen35_preset("qwen3.5-9b", 4096, 32, 16, 4, 12288, 32, false); }},
      {"qwen3.5-4b", [] { return qwen35_preset("qwen3.5-4b", 2560, 32, 16, 4, 9216, 32, true); }},
      {"qwen3.5-2b", [] { return qwen35_preset("qwen3.5-2b", 2048, 24, 8, 2, 6144, 16, true); }},
      {"qwen3.5-0.8b", [] { return qwen35_preset("qwen3.5-0.8b", 1024, 24, 8, 2, 3584, 16, true); }},
      // Tiny shapes for tests, fixtures and the demo (small vocab so they run in milliseconds).
      {"tiny-qwen2",
       [] {
         auto c = qwen2_shape("tiny-qwen2", 64, 2, 4, 2, 128, 256, true, 10000.0);
         c.bos_token_id = c.eos_token_id = 1;
         c.max_position = 2048;
         c.rope_scaling.original_max_position_embeddings = 2048;
         return c;
       }},
      {"tiny-qwen3",
       [] {
         auto c = qwen3_shape("tiny-qwen3", 64, 2, 4, 2, 32, 128, 256, false);
         c.rope_theta = 10000.0;
         c.bos_token_id = c.eos_token_id = 1;
         c.max_position = 2048;
         c.rope_scaling.original_max_position_embeddings = 2048;
         return c;
       }},
      {"tiny-qwen35",
       [] {
         // 3 linear + 1 full layer; more value than key heads; head dims 32 (full) and 16/24 (linear).
         auto c = qwen35_preset("tiny-qwen35", 64, 4, 4, 2, 128, 4, true);
         c.head_dim = 32;
         c.linear = LinearAttnConfig{2, 4, 16, 24, 4};
         c.vocab = 256;
         c.rope_theta = 10000.0;
         c.bos_token_id = c.eos_token_id = 1;
         c.max_position = 2048;
         c.rope_scaling.original_max_position_embeddings = 2048;
         return c;
       }},
      {"tiny-llama3",
       [] {
         auto c = llama3_shape("tiny-llama3", 64, 2, 4, 2, 128, 256, false);
         c.rope_scaling = RopeScaling{"llama3", 8.0, 1.0, 4.0, 64};
         c.max_position = 2048;
         c.bos_token_id = 1;
         c.eos_token_id = 2;
         return c;
       }},
  };
  return p;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> n;
  for (auto& p : presets()) n.push_back(p.name);
  return n;
}

bool is_preset(const std::string& name) {
  for (auto& p : presets())
    if (name == p.name) return true;
  return false;
}

ModelConfig preset_config(const std::string& name) {
  for (auto& p : presets())
    if (name == p.name) return p.make();
  std::string all;
  for (auto& p : presets()) all += (all.empty() ? "" : ", ") + std::string(p.name);
  fail("unknown model preset '{}' (presets: {})", name, all);
}

ModelConfig resolve_model(const std::string& dir_or_preset) {
  namespace fs = std::filesystem;
  if (is_preset(dir_or_preset)) return preset_config(dir_or_preset);
  if (fs::exists(dir_or_preset)) return load_model_config(dir_or_preset);
  std::string all;
  for (auto& p : presets()) all += (all.empty() ? "" : ", ") + std::string(p.name);
  fail("--model '{}': neither a model directory/config.json nor a preset (presets: {})", dir_or_preset, all);
}

}  // namespace lt
