#include "train/config.h"

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <variant>

#include "core/error.h"
#include "plan/heuristics.h"
#include "core/units.h"

namespace lt::train {
namespace {

using Member = std::variant<std::string TrainConfig::*, int64_t TrainConfig::*, double TrainConfig::*,
                            bool TrainConfig::*>;
struct Field {
  const char* key;
  Member member;
};

// One row per key. "template" maps to template_name (a C++ keyword).
const std::vector<Field>& fields() {
  using C = TrainConfig;
  static const std::vector<Field> f = {
      {"model_name_or_path", &C::model_name_or_path},
      {"model_overrides", &C::model_overrides},
      {"tokenizer", &C::tokenizer},
      {"dataset", &C::dataset},
      {"eval_dataset", &C::eval_dataset},
      {"template", &C::template_name},
      {"cutoff_len", &C::cutoff_len},
      {"packing", &C::packing},
      {"train_on_inputs", &C::train_on_inputs},
      {"val_size", &C::val_size},
      {"max_samples", &C::max_samples},
      {"dataset_format", &C::dataset_format},
      {"on_malformed", &C::on_malformed},
      {"overlong", &C::overlong},
      {"per_device_train_batch_size", &C::per_device_train_batch_size},
      {"per_device_eval_batch_size", &C::per_device_eval_batch_size},
      {"gradient_accumulation_steps", &C::gradient_accumulation_steps},
      {"learning_rate", &C::learning_rate},
      {"lr_scheduler_type", &C::lr_scheduler_type},
      {"warmup_ratio", &C::warmup_ratio},
      {"warmup_steps", &C::warmup_steps},
      {"min_lr_ratio", &C::min_lr_ratio},
      {"weight_decay", &C::weight_decay},
      {"adam_beta1", &C::adam_beta1},
      {"adam_beta2", &C::adam_beta2},
      {"adam_epsilon", &C::adam_epsilon},
      {"max_grad_norm", &C::max_grad_norm},
      {"max_skipped_steps", &C::max_skipped_steps},
      {"num_train_epochs", &C::num_train_epochs},
      {"max_steps", &C::max_steps},
      {"logging_steps", &C::logging_steps},
      {"save_steps", &C::save_steps},
      {"save_total_limit", &C::save_total_limit},
      {"eval_steps", &C::eval_steps},
      {"save_dtype", &C::save_dtype},
      {"save_final", &C::save_final},
      {"output_dir", &C::output_dir},
      {"overwrite_output_dir", &C::overwrite_output_dir},
      {"seed", &C::seed},
      {"resume_from_checkpoint", &C::resume_from_checkpoint},
      {"gpu_mem", &C::gpu_mem},
      {"host_mem", &C::host_mem},
      {"nvme_dir", &C::nvme_dir},
      {"nvme_mem", &C::nvme_mem},
      {"planner", &C::planner},
      {"profile", &C::profile},
      {"optimizer", &C::optimizer},
      {"master_weights", &C::master_weights},
      {"gradients", &C::gradients},
      {"gradient_dtype", &C::gradient_dtype},
      {"optimizer_nvme", &C::optimizer_nvme},
      {"keep_internals", &C::keep_internals},
      {"embedding_rows_first", &C::embedding_rows_first},
      {"embedding_update", &C::embedding_update},
      {"device_update_layers", &C::device_update_layers},
      {"backend", &C::backend},
      {"threads", &C::threads},
      {"peak_tflops", &C::peak_tflops},
      {"progress_bar", &C::progress_bar},
      {"trace", &C::trace},
      {"trace_step", &C::trace_step},
      {"do_eval_dataset", &C::do_eval_dataset},
      {"eval_max_samples", &C::eval_max_samples},
      {"max_new_tokens", &C::max_new_tokens},
  };
  return f;
}

const Field* find_field(const std::string& key) {
  for (const auto& f : fields())
    if (key == f.key) return &f;
  return nullptr;
}

[[noreturn]] void unknown_key(const std::string& key, const std::string& source) {
  std::string near = nearest_key(key);
  if (!near.empty()) fail("{}: unknown key '{}'; did you mean '{}'?", source, key, near);
  fail("{}: unknown key '{}'; valid keys: {}", source, key, fmt::join(config_keys(), ", "));
}

std::string node_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "null";
}

int line_of(const YAML::Node& n) { return n.Mark().line + 1; }

// The text of a mapping key; a list, a mapping or null as a key is an error naming the line.
std::string key_text(const YAML::Node& k, const std::string& source) {
  if (k.IsScalar()) return k.Scalar();
  fail("{}: the key at line {} is {}; a key must be a name (a plain scalar)", source, line_of(k), node_text(k));
}

// The keys of a mapping in file order; a key written twice is an error naming both lines (yaml-cpp keeps
// both entries, and the later one would silently win).
std::vector<std::pair<std::string, std::pair<YAML::Node, YAML::Node>>> mapping_entries(const YAML::Node& map,
                                                                                      const std::string& source,
                                                                                      const std::string& what) {
  std::vector<std::pair<std::string, std::pair<YAML::Node, YAML::Node>>> out;
  std::map<std::string, int> first_line;
  for (const auto& kv : map) {
    std::string key = key_text(kv.first, source);
    const int line = line_of(kv.first);
    auto [it, fresh] = first_line.emplace(key, line);
    if (!fresh)
      fail("{}: duplicate key '{}'{} at line {} and line {}; keep one", source, key, what, it->second, line);
    out.push_back({std::move(key), {kv.first, kv.second}});
  }
  return out;
}

// Sets one field from a YAML node, with type checking. YAML scalars are untyped text, so
// the expected type decides how to read them; a mismatch names key, expected and actual.
nlohmann::json yaml_scalar_to_json(const YAML::Node& n) {
  if (n.IsNull()) return nullptr;
  const std::string& s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted in the file: keep as a string
  bool b;
  long long i;
  double d;
  size_t pos = 0;
  try {
    i = std::stoll(s, &pos);
    if (pos == s.size()) return i;
  } catch (...) {
  }
  if (YAML::convert<double>::decode(n, d)) return d;
  if (YAML::convert<bool>::decode(n, b)) return b;
  return s;
}

nlohmann::json yaml_to_json(const YAML::Node& n, const std::string& source) {
  if (n.IsMap()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [key, kv] : mapping_entries(n, source, " in model_overrides"))
      j[key] = yaml_to_json(kv.second, source);
    return j;
  }
  if (n.IsSequence()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& e : n) j.push_back(yaml_to_json(e, source));
    return j;
  }
  return yaml_scalar_to_json(n);
}

void set_field(TrainConfig& c, const Field& f, const YAML::Node& n, const std::string& source) {
  const std::string key = f.key;
  if (key == "model_overrides") {  // a mapping of HF config.json fields, kept as JSON text
    if (n.IsNull() || (n.IsScalar() && n.Scalar().empty())) {
      c.model_overrides.clear();
      return;
    }
    LT_CHECK(n.IsMap(), "{}: key 'model_overrides' expects a mapping of config.json fields, got '{}'", source,
             n.IsScalar() ? n.Scalar() : std::string("a list"));
    c.model_overrides = yaml_to_json(n, source).dump();
    return;
  }
  auto bad = [&](const char* expected) {
    fail("{}: key '{}' expects {}, got '{}'", source, key, expected, node_text(n));
  };
  if (!n.IsScalar() && !n.IsNull()) {
    std::visit([&](auto m) {
      using T = std::remove_reference_t<decltype(c.*m)>;
      if constexpr (std::is_same_v<T, std::string>) bad("a string");
      else if constexpr (std::is_same_v<T, bool>) bad("a boolean (true/false)");
      else if constexpr (std::is_same_v<T, int64_t>) bad("an integer");
      else bad("a number");
    }, f.member);
  }
  std::visit([&](auto m) {
    using T = std::remove_reference_t<decltype(c.*m)>;
    if constexpr (std::is_same_v<T, std::string>) {
      c.*m = n.IsNull() ? std::string() : n.Scalar();
    } else if constexpr (std::is_same_v<T, bool>) {
      bool v;
      if (n.IsNull() || !YAML::convert<bool>::decode(n, v)) bad("a boolean (true/false)");
      c.*m = v;
    } else if constexpr (std::is_same_v<T, int64_t>) {
      if (n.IsNull()) bad("an integer");
      const std::string& s = n.Scalar();
      size_t pos = 0;
      long long v = 0;
      try {
        v = std::stoll(s, &pos);
      } catch (...) {
        pos = 0;
      }
      if (pos != s.size() || s.empty()) {
        // Accept integral floats written like 1e3 or 100.0.
        double d = 0;
        if (YAML::convert<double>::decode(n, d) && d == static_cast<double>(static_cast<long long>(d)))
          v = static_cast<long long>(d);
        else
          bad("an integer");
      }
      c.*m = v;
    } else {
      double v;
      if (n.IsNull() || !YAML::convert<double>::decode(n, v)) bad("a number");
      if (!std::isfinite(v)) bad("a finite number");
      c.*m = v;
    }
  }, f.member);
}

}  // namespace

const std::vector<std::string>& config_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& f : fields()) k.push_back(f.key);
    return k;
  }();
  return keys;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest_key(const std::string& key) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& k : config_keys()) {
    size_t d = edit_distance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  size_t limit = std::max<size_t>(2, key.size() / 3);
  return best_d <= limit ? best : std::string();
}

TrainConfig parse_config(const std::string& yaml_text, const std::string& source,
                         const std::vector<std::string>& overrides) {
  TrainConfig c;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    fail("{}: invalid YAML at line {}, column {}: {}", source, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  if (root.IsDefined() && !root.IsNull()) {
    LT_CHECK(root.IsMap(), "{}: expected a mapping of key: value at the top level, got {}", source,
             node_text(root));
    try {
      for (const auto& [key, kv] : mapping_entries(root, source, "")) {
        const Field* f = find_field(key);
        if (!f) unknown_key(key, source);
        set_field(c, *f, kv.second, fmt::format("{} (line {})", source, line_of(kv.first)));
      }
    } catch (const YAML::Exception& e) {
      fail("{}: line {}, column {}: {}", source, e.mark.line + 1, e.mark.column + 1, e.msg);
    }
  }
  for (const auto& ov : overrides) {
    auto eq = ov.find('=');
    LT_CHECK(eq != std::string::npos && eq > 0, "override '{}': expected key=value", ov);
    std::string key = ov.substr(0, eq), val = ov.substr(eq + 1);
    const Field* f = find_field(key);
    if (!f) unknown_key(key, "command line");
    YAML::Node n;
    try {
      n = YAML::Load(val);
    } catch (const YAML::Exception&) {
      n = YAML::Node(val);
    }
    if (val.empty()) n = YAML::Node(YAML::NodeType::Null);
    set_field(c, *f, n, "command line override");
  }
  validate_config(c);
  return c;
}

TrainConfig load_config(const std::filesystem::path& file, const std::vector<std::string>& overrides) {
  std::ifstream in(file);
  LT_CHECK(in.good(), "cannot open config file '{}'", file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  TrainConfig c = parse_config(ss.str(), file.string(), overrides);
  c.config_path = file;
  c.overrides = overrides;
  return c;
}

std::optional<int64_t> parse_device_update_layers(const std::string& v, const std::string& what) {
  if (v == "auto") return std::nullopt;
  size_t used = 0;
  long long k = -1;
  try {
    k = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  LT_CHECK(used == v.size() && !v.empty() && k >= 0,
           "{} must be auto or a count of layers >= 0, got '{}'", what, v);
  return int64_t(k);
}

namespace {

// "inf", "-inf" or "nan" (a NaN's sign bit is not shown).
std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  return fmt::format("{}", v);
}

// Every float key holds a finite number (parse_config rejects .inf and .nan as written; this covers configs
// built in code).
void check_finite_numbers(const TrainConfig& c) {
  for (const auto& f : fields())
    if (const auto* m = std::get_if<double TrainConfig::*>(&f.member))
      LT_CHECK(std::isfinite(c.**m), "config: {} must be a finite number, got {}", f.key, number_text(c.**m));
}

}  // namespace

void validate_config(const TrainConfig& c) {
  auto one_of = [](const std::string& key, const std::string& v, std::initializer_list<const char*> ok) {
    for (const char* o : ok)
      if (v == o) return;
    fail("config: {} = '{}' is not valid; expected one of: {}", key, v, fmt::join(ok, ", "));
  };
  auto positive = [](const char* key, int64_t v) {
    LT_CHECK(v > 0, "config: {} must be > 0, got {}", key, v);
  };
  LT_CHECK(!c.model_name_or_path.empty(), "config: model_name_or_path is required (a model directory or a preset name)");
  check_finite_numbers(c);
  positive("cutoff_len", c.cutoff_len);
  positive("per_device_train_batch_size", c.per_device_train_batch_size);
  positive("gradient_accumulation_steps", c.gradient_accumulation_steps);
  positive("logging_steps", c.logging_steps);
  positive("max_new_tokens", c.max_new_tokens);
  LT_CHECK(c.per_device_eval_batch_size >= 0, "config: per_device_eval_batch_size must be >= 0, got {}",
           c.per_device_eval_batch_size);
  LT_CHECK(c.learning_rate >= 0, "config: learning_rate must be >= 0, got {}", c.learning_rate);
  LT_CHECK(c.warmup_ratio >= 0 && c.warmup_ratio <= 1, "config: warmup_ratio must be in [0, 1], got {}", c.warmup_ratio);
  LT_CHECK(c.warmup_steps >= 0, "config: warmup_steps must be >= 0, got {}", c.warmup_steps);
  LT_CHECK(c.threads >= 0, "config: threads must be >= 0 (0 = all cores), got {}", c.threads);
  LT_CHECK(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1, "config: min_lr_ratio must be in [0, 1], got {}", c.min_lr_ratio);
  LT_CHECK(c.weight_decay >= 0, "config: weight_decay must be >= 0, got {}", c.weight_decay);
  LT_CHECK(c.max_skipped_steps >= 0,
           "config: max_skipped_steps must be an integer >= 0 (the step that makes this many non-finite steps in a "
           "row stops training; 0: the first), got {}",
           c.max_skipped_steps);
  LT_CHECK(c.max_steps > 0 || c.num_train_epochs > 0, "config: set max_steps > 0 or num_train_epochs > 0");
  LT_CHECK(c.save_steps >= 0 && c.save_total_limit >= 0 && c.eval_steps >= 0,
           "config: save_steps, save_total_limit and eval_steps must be >= 0");
  LT_CHECK(c.val_size >= 0, "config: val_size must be >= 0, got {}", c.val_size);
  LT_CHECK(!c.output_dir.empty(), "config: output_dir must not be empty");
  one_of("on_malformed", c.on_malformed, {"skip", "fatal"});
  one_of("overlong", c.overlong, {"truncate", "skip"});
  one_of("lr_scheduler_type", c.lr_scheduler_type, {"constant", "linear", "cosine"});
  one_of("optimizer", c.optimizer, {"adamw", "adamw8bit", "hybrid"});
  one_of("master_weights", c.master_weights, {"fp32", "bf16-sr", "auto"});
  one_of("gradients", c.gradients, {"host", "device", "auto"});
  one_of("gradient_dtype", c.gradient_dtype, {"fp32", "bf16", "auto"});
  one_of("embedding_update", c.embedding_update, {"host", "device", "auto"});
  (void)device_update_layers_of(c);  // "auto" or a count >= 0
  LT_CHECK(!(c.gradient_dtype == "bf16" && c.gradients == "host"),
           "config: gradient_dtype: bf16 applies to gradients held on the device, but gradients: host keeps fp32 "
           "accumulators on the host (set gradients: device or auto)");
  one_of("optimizer_nvme", c.optimizer_nvme, {"none", "auto", "all"});
  LT_CHECK(c.optimizer_nvme == "none" || !c.nvme_dir.empty(),
           "config: optimizer_nvme: {} may keep layers' optimizer moments in files on NVMe and needs nvme_dir (a "
           "directory on a local SSD)", c.optimizer_nvme);
  one_of("backend", c.backend, {"auto", "cpu", "cuda"});
  one_of("save_dtype", c.save_dtype, {"bf16", "fp32"});
  (void)canonical_planner(c.planner);  // the same names as `plan --planner` (plan/heuristics.h); resolved in planning
  for (auto [key, v] : {std::pair{"gpu_mem", &c.gpu_mem}, {"host_mem", &c.host_mem}, {"nvme_mem", &c.nvme_mem}}) {
    if (v->empty()) continue;
    try {
      parse_bytes(*v);
    } catch (const Error& e) {
      fail("config: {}: {}", key, e.what());
    }
  }
}

namespace {

// A JSON value as a YAML node (model_overrides in the dump): mappings and lists as such, strings quoted
// (so that "true" or "12" stay strings when read back), numbers and booleans as plain scalars.
void emit_json(YAML::Emitter& out, const nlohmann::json& j) {
  if (j.is_object()) {
    out << YAML::BeginMap;
    for (auto it = j.begin(); it != j.end(); ++it) {
      out << YAML::Key << it.key() << YAML::Value;
      emit_json(out, it.value());
    }
    out << YAML::EndMap;
  } else if (j.is_array()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& e : j) emit_json(out, e);
    out << YAML::EndSeq;
  } else if (j.is_string()) {
    out << YAML::DoubleQuoted << j.get<std::string>();
  } else if (j.is_null()) {
    out << YAML::Null;
  } else {
    out << j.dump();  // number or boolean: JSON's text is YAML's
  }
}

}  // namespace

std::string config_to_yaml(const TrainConfig& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const auto& f : fields()) {
    out << YAML::Key << f.key << YAML::Value;
    std::visit([&](auto m) {
      using T = std::remove_cvref_t<decltype(c.*m)>;  // c is const: strip it to match the member type
      if constexpr (std::is_same_v<T, std::string>) {
        if (std::string(f.key) == "model_overrides" && !(c.*m).empty()) emit_json(out, nlohmann::json::parse(c.*m));
        else out << YAML::DoubleQuoted << (c.*m);
      }
      else if constexpr (std::is_same_v<T, double>) out << fmt::format("{}", c.*m);
      else out << (c.*m);
    }, f.member);
  }
  out << YAML::EndMap;
  return out.c_str();
}

}  // namespace lt::train
