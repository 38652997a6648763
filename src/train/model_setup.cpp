#include "train/model_setup.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "core/units.h"
#include "io/model_io.h"
#include "train/checkpoint.h"

namespace lt::train {

namespace fs = std::filesystem;

bool has_weights(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  if (fs::exists(dir / "model.safetensors") || fs::exists(dir / "model.safetensors.index.json")) return true;
  return false;
}

fs::path find_tokenizer(const ModelSection& cfg, const std::optional<fs::path>& resume) {
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
  if (has_tok(cfg.name_or_path)) return cfg.name_or_path;
  fail("no tokenizer: '{}' has no tokenizer.json; set `tokenizer:` to a tokenizer.json or its directory",
       cfg.name_or_path);
}

namespace {

// The field of `read` nearest to `key` by edit distance, or "" when none is close (as config keys:
// distance <= max(2, len/3)). Nested names ("text_config.x") are not candidates.
std::string nearest_field(const std::string& key, const std::set<std::string>& read) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& f : read) {
    if (f.find('.') != std::string::npos) continue;
    const size_t d = edit_distance(key, f);
    if (d < best_d) best_d = d, best = f;
  }
  return best_d <= std::max<size_t>(2, key.size() / 3) ? best : std::string();
}

// Every overridden field must be one the config parser read for this architecture: any other is a typo
// or a field without effect, which would otherwise be dropped without a word.
void check_override_fields(const nlohmann::json& ov, const std::set<std::string>& read, const ModelConfig& base,
                           const std::string& source) {
  for (auto it = ov.begin(); it != ov.end(); ++it) {
    if (read.count(it.key())) continue;
    const std::string near = nearest_field(it.key(), read);
    if (!near.empty())
      fail("{}: unknown config.json field '{}'; did you mean '{}'?", source, it.key(), near);
    std::vector<std::string> names;
    for (const auto& f : read)
      if (f.find('.') == std::string::npos) names.push_back(f);
    fail("{}: field '{}' is not a config.json field lazytrain reads for {}, so overriding it would have no effect; "
         "the fields it reads: {}",
         source, it.key(), arch_hf_name(base.arch), fmt::join(names, ", "));
  }
}

// Parameters of one decoder layer of each kind (model/mixer_attention.cpp, mixer_deltanet.cpp,
// param_layout.cpp), in long double.
long double attention_layer_params(const ModelConfig& c) {
  const long double H = c.hidden, Q = (long double)c.heads * c.head_dim, KV = (long double)c.kv_heads * c.head_dim;
  const long double q_out = c.attn_output_gate ? 2 * Q : Q;
  long double n = q_out * H + 2 * KV * H + H * Q;
  if (c.attn_bias) n += q_out + 2 * KV;
  if (c.qk_norm) n += 2 * (long double)c.head_dim;
  return n;
}

long double deltanet_layer_params(const ModelConfig& c) {
  const auto& l = c.linear;
  const long double H = c.hidden, key_dim = (long double)l.k_heads * l.k_head_dim,
                    value_dim = (long double)l.v_heads * l.v_head_dim, conv_dim = 2 * key_dim + value_dim;
  return conv_dim * H + value_dim * H + 2 * (long double)l.v_heads * H + conv_dim * l.conv_kernel +
         2 * (long double)l.v_heads + l.v_head_dim + H * value_dim;
}

// Bytes as GiB/TiB/... (format_bytes below a TiB), in scientific notation past EiB.
std::string size_text(long double bytes) {
  if (bytes < (long double)(int64_t(1) << 40)) return format_bytes(double(bytes));
  const char* units[] = {"TiB", "PiB", "EiB"};
  long double v = bytes / (long double)(int64_t(1) << 40);
  for (const char* u : units) {
    if (v < 1024 || std::string(u) == "EiB") {
      if (v < 1e6) return fmt::format("{:.2f} {}", double(v), u);
      break;
    }
    v /= 1024;
  }
  return fmt::format("{:.3g} bytes", double(bytes));
}

// The value of a config key as a message shows it ("{}" for no model_overrides).
std::string shown_overrides(const std::string& json_text) { return json_text.empty() ? "{}" : json_text; }

// The config the checkpoint was trained with (its trainer_config.yaml), or nullopt when it has none or it no
// longer parses (a checkpoint of an older lazytrain).
std::optional<TrainConfig> checkpoint_config(const fs::path& ckpt) {
  const fs::path file = ckpt / "trainer_config.yaml";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return std::nullopt;
  try {
    return load_config(file);
  } catch (const Error& e) {
    log_info("resume: {} not compared with this run's config: {}", file.string(), e.what());
    return std::nullopt;
  }
}

}  // namespace

void check_resume_keys(const TrainConfig& cfg, const fs::path& ckpt) {
  const std::string name = ckpt.filename().string();
  std::vector<std::string> changed;
  if (const auto saved = checkpoint_config(ckpt)) {
    const auto json_of = [](const std::string& s) { return s.empty() ? nlohmann::json::object() : nlohmann::json::parse(s); };
    if (json_of(saved->model.overrides) != json_of(cfg.model.overrides))
      changed.push_back(fmt::format("model_overrides ({} trained {}, this run sets {}: the model's shape and weights "
                                    "come from the checkpoint)",
                                    name, shown_overrides(saved->model.overrides),
                                    shown_overrides(cfg.model.overrides)));
    if (saved->model.name_or_path != cfg.model.name_or_path)
      log_warn("resume: model_name_or_path '{}' is ignored: {} continues the model it was trained from ('{}'), whose "
               "config and weights it holds",
               cfg.model.name_or_path, name, saved->model.name_or_path);
  }
  const TrainerState state = read_trainer_state(ckpt);
  if (state.seed != uint64_t(cfg.schedule.seed))
    changed.push_back(fmt::format("seed ({} trained with {}, this run sets {}: the data order and the rounding stream "
                                  "continue the checkpoint's)",
                                  name, state.seed, cfg.schedule.seed));
  if (changed.empty()) return;
  fail("resume from {}: {} cannot change on resume: {}. Restore the checkpoint's value{}, or start a new run (another "
       "output_dir, or overwrite_output_dir=true)",
       ckpt.string(), changed.size() == 1 ? "this key" : "these keys", fmt::join(changed, "; "),
       changed.size() == 1 ? "" : "s");
}

long double model_parameter_count(const ModelConfig& c) {
  const long double H = c.hidden, V = c.vocab;
  const long double per_layer_common = 2 * H + 3 * H * (long double)c.ffn;  // two norms, gate/up/down
  long double n = V * H + H + (c.tied ? 0 : V * H);                       // embedding, final norm, untied head
  n += (long double)c.count(LayerKind::Attention) * (per_layer_common + attention_layer_params(c));
  n += (long double)c.count(LayerKind::GatedDeltaNet) * (per_layer_common + deltanet_layer_params(c));
  return n;
}

void check_model_fits_host(const ModelConfig& c, const PlacementSection& cfg) {
  // The smallest host state any plan keeps: the bf16 master of every parameter (master_weights: bf16-sr,
  // moments on NVMe, gradients on the device); the largest per-parameter byte count any part uses is 16
  // (fp32 AdamW: master, gradient, two moments), which 64-bit byte counts must hold.
  constexpr long double kMinHostBytesPerParam = 2, kMaxBytesPerParam = 16;
  const long double params = model_parameter_count(c);
  const long double need = params * kMinHostBytesPerParam;
  const bool given = !cfg.host_mem.empty();
  const int64_t have = given ? parse_bytes(cfg.host_mem) : mem_available_bytes();
  const bool countable = params * kMaxBytesPerParam < (long double)std::numeric_limits<int64_t>::max();
  if (countable && (have <= 0 || need <= (long double)have)) return;
  const std::string shape =
      fmt::format("hidden_size {}, intermediate_size {}, num_hidden_layers {}, vocab_size {}: embedding {:.4g}, "
                  "layers {:.4g}, head {:.4g}",
                  c.hidden, c.ffn, c.layers, c.vocab, double((long double)c.vocab * c.hidden),
                  double(params - (long double)c.vocab * c.hidden * (c.tied ? 1 : 2) - c.hidden),
                  double((long double)c.hidden + (c.tied ? 0 : (long double)c.vocab * c.hidden)));
  const std::string budget = have <= 0 ? std::string("an unknown amount (MemAvailable unreadable)")
                             : given   ? fmt::format("{} (host_mem)", size_text(have))
                                       : fmt::format("{} available (MemAvailable; set host_mem to plan for another host)",
                                                   size_text(have));
  fail("does not fit: host memory short by {}: model {} has {:.4g} parameters ({}), whose bf16 master weights alone "
       "need {} at 2 bytes per parameter (the smallest host state of any plan), against {}{}",
       size_text(have > 0 ? need - have : need), c.name, double(params), shape, size_text(need), budget,
       countable ? "" : "; its byte counts would not even fit 64-bit integers");
}

ModelConfig configured_model(const ModelSection& cfg) {
  ModelConfig base = resolve_model(cfg.name_or_path);
  if (cfg.overrides.empty()) return base;
  const std::string source = "model_overrides on " + cfg.name_or_path;
  nlohmann::json j = model_config_to_json(base);
  nlohmann::json ov;
  try {
    ov = nlohmann::json::parse(cfg.overrides);
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
  std::set<std::string> read;
  ModelConfig c = model_config_from_json(j, source, &read);
  check_override_fields(ov, read, base, source);
  c.name = base.name;
  return c;
}

ModelSetup setup_model(const TrainConfig& cfg, const std::optional<fs::path>& resume) {
  fs::path tok_path = find_tokenizer(cfg.model, resume);
  ModelSetup ms{data::load_tokenizer(tok_path.string()), tok_path, {}, {}, {}, false, {}};
  const auto& tok = ms.tokenizer.tokenizer;
  if (resume) {
    check_resume_keys(cfg, *resume);
    ms.model = load_model_config(*resume);
    check_model_fits_host(ms.model, cfg.placement);
    ms.layout = model_layout(ms.model);
    ms.initial.source = InitialWeights::Source::Checkpoint;
    ms.weights_source = *resume;
    return ms;
  }
  ModelConfig c = configured_model(cfg.model);
  const bool pretrained = has_weights(cfg.model.name_or_path);
  if (pretrained) {
    LT_CHECK(cfg.model.overrides.empty(),
             "model_overrides: '{}' has weights; overriding its shape is only allowed for random initialisation",
             cfg.model.name_or_path);
    LT_CHECK(tok.vocab_size() <= c.vocab, "tokenizer '{}' has {} ids but the model's vocab_size is {}",
             tok_path.string(), tok.vocab_size(), c.vocab);
    ms.initial = {InitialWeights::Source::Pretrained, cfg.model.name_or_path, 0};
    ms.model = load_model_config(cfg.model.name_or_path);
    check_model_fits_host(ms.model, cfg.placement);
    ms.pretrained = true;
    ms.weights_source = cfg.model.name_or_path;
  } else {
    // Random initialisation: the vocabulary follows the tokenizer unless model_overrides sets it.
    bool vocab_given = !cfg.model.overrides.empty() &&
                       nlohmann::json::parse(cfg.model.overrides).contains("vocab_size");
    if (!vocab_given && c.vocab != tok.vocab_size()) {
      log_info("model: vocab_size {} -> {} (the tokenizer's) for random initialisation", c.vocab, tok.vocab_size());
      c.vocab = tok.vocab_size();
    }
    LT_CHECK(tok.vocab_size() <= c.vocab, "tokenizer '{}' has {} ids but model_overrides sets vocab_size {}",
             tok_path.string(), tok.vocab_size(), c.vocab);
    check_model_fits_host(c, cfg.placement);
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
    ms.initial = {InitialWeights::Source::Random, {}, uint64_t(cfg.schedule.seed)};
    log_info("model: {} initialised at random (seed {}), {} parameters", c.name, cfg.schedule.seed,
             model_layout(c).parameter_count());
  }
  ms.layout = model_layout(ms.model);
  return ms;
}

}  // namespace lt::train
