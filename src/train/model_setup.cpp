#include "train/model_setup.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "io/model_io.h"

namespace lt::train {

namespace fs = std::filesystem;

bool has_weights(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  if (fs::exists(dir / "model.safetensors") || fs::exists(dir / "model.safetensors.index.json")) return true;
  return false;
}

fs::path find_tokenizer(const TrainConfig& cfg, const std::optional<fs::path>& resume) {
  auto has_tok = [](const fs::path& p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec) || fs::is_regular_file(p / "tokenizer.json", ec);
  };
  if (!cfg.tokenizer.empty()) {
    LT_CHECK(has_tok(cfg.tokenizer), "tokenizer: '{}' is neither a tokenizer.json nor a directory containing one",
             cfg.tokenizer);
    return cfg.tokenizer;
  }
  if (resume && has_tok(*resume)) return *resume;
  if (has_tok(cfg.model_name_or_path)) return cfg.model_name_or_path;
  fail("no tokenizer: '{}' has no tokenizer.json; set `tokenizer:` to a tokenizer.json or its directory",
       cfg.model_name_or_path);
}

ModelConfig configured_model(const TrainConfig& cfg) {
  ModelConfig base = resolve_model(cfg.model_name_or_path);
  if (cfg.model_overrides.empty()) return base;
  nlohmann::json j = model_config_to_json(base);
  nlohmann::json ov;
  try {
    ov = nlohmann::json::parse(cfg.model_overrides);
  } catch (const nlohmann::json::exception& e) {
    fail("model_overrides: invalid: {}", e.what());
  }
  for (auto it = ov.begin(); it != ov.end(); ++it) j[it.key()] = it.value();
  // A new depth without a new layer list: the list follows from full_attention_interval (Qwen3.5).
  if (ov.contains("num_hidden_layers") && !ov.contains("layer_types")) j.erase("layer_types");
  // head_dim follows hidden/heads unless given (HF derives it the same way for Qwen2/Llama).
  if (!ov.contains("head_dim") && (ov.contains("hidden_size") || ov.contains("num_attention_heads")) &&
      base.arch != Arch::Qwen3)
    j.erase("head_dim");
  ModelConfig c = model_config_from_json(j, "model_overrides on " + cfg.model_name_or_path);
  c.name = base.name;
  return c;
}

ModelSetup setup_model(const TrainConfig& cfg, const std::optional<fs::path>& resume) {
  fs::path tok_path = find_tokenizer(cfg, resume);
  ModelSetup ms{data::load_tokenizer(tok_path.string()), tok_path, {}, {}, {}, false, {}};
  const auto& tok = ms.tokenizer.tokenizer;
  if (resume) {
    ms.model = load_model_config(*resume);
    ms.layout = model_layout(ms.model);
    ms.initial.source = InitialWeights::Source::Checkpoint;
    ms.weights_source = *resume;
    return ms;
  }
  ModelConfig c = configured_model(cfg);
  const bool pretrained = has_weights(cfg.model_name_or_path);
  if (pretrained) {
    LT_CHECK(cfg.model_overrides.empty(),
             "model_overrides: '{}' has weights; overriding its shape is only allowed for random initialisation",
             cfg.model_name_or_path);
    LT_CHECK(tok.vocab_size() <= c.vocab, "tokenizer '{}' has {} ids but the model's vocab_size is {}",
             tok_path.string(), tok.vocab_size(), c.vocab);
    ms.initial = {InitialWeights::Source::Pretrained, cfg.model_name_or_path, 0};
    ms.model = load_model_config(cfg.model_name_or_path);
    ms.pretrained = true;
    ms.weights_source = cfg.model_name_or_path;
  } else {
    // Random initialisation: the vocabulary follows the tokenizer unless model_overrides sets it.
    bool vocab_given = !cfg.model_overrides.empty() &&
                       nlohmann::json::parse(cfg.model_overrides).contains("vocab_size");
    if (!vocab_given && c.vocab != tok.vocab_size()) {
      log_info("model: vocab_size {} -> {} (the tokenizer's) for random initialisation", c.vocab, tok.vocab_size());
      c.vocab = tok.vocab_size();
    }
    LT_CHECK(tok.vocab_size() <= c.vocab, "tokenizer '{}' has {} ids but model_overrides sets vocab_size {}",
             tok_path.string(), tok.vocab_size(), c.vocab);
    auto id_of = [&](const std::string& t) -> int64_t {
      if (t.empty()) return -1;
      auto id = tok.token_to_id(t);
      return id ? *id : -1;
    };
    const auto& tc = ms.tokenizer.config;
    if (id_of(tc.eos_token) >= 0) c.eos_token_id = id_of(tc.eos_token);
    if (id_of(tc.bos_token) >= 0) c.bos_token_id = id_of(tc.bos_token);
    if (id_of(tc.pad_token) >= 0) c.pad_token_id = id_of(tc.pad_token);
    ms.model = c;
    ms.initial = {InitialWeights::Source::Random, {}, uint64_t(cfg.seed)};
    log_info("model: {} initialised at random (seed {}), {} parameters", c.name, cfg.seed,
             model_layout(c).parameter_count());
  }
  ms.layout = model_layout(ms.model);
  return ms;
}

}  // namespace lt::train
