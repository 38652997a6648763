// Reading a training config from YAML and the command line, and writing it back (the keys and their sections:
// config_sections.cpp).
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
#include "train/config_fields.h"

namespace lt::train {
namespace {

const Field* find_field(const std::string& key) {
  for (const auto& f : config_fields())
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

// A scalar of model_overrides as JSON: quoted text stays a string, else an integer, a number or a boolean as it reads.
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

// The text of the keys parsed from text (TextSlot: the enums, device_update_layers) with where it was set, parsed once
// the file and the command line are read (a command-line override may correct the file's value).
using PendingText = std::map<const Field*, std::pair<std::string, std::string>>;

[[noreturn]] void bad_value(const Field& f, const YAML::Node& n, const std::string& source, const char* expected) {
  fail("{}: key '{}' expects {}, got '{}'", source, f.key, expected, node_text(n));
}

const char* expected_type(const Slot& s) {
  if (std::holds_alternative<bool*>(s)) return "a boolean (true/false)";
  if (std::holds_alternative<int64_t*>(s)) return "an integer";
  if (std::holds_alternative<double*>(s)) return "a number";
  return "a string";
}

int64_t integer_of(const Field& f, const YAML::Node& n, const std::string& source) {
  if (n.IsNull()) bad_value(f, n, source, "an integer");
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
      bad_value(f, n, source, "an integer");
  }
  return v;
}

double number_of(const Field& f, const YAML::Node& n, const std::string& source) {
  double v;
  if (n.IsNull() || !YAML::convert<double>::decode(n, v)) bad_value(f, n, source, "a number");
  if (!std::isfinite(v)) bad_value(f, n, source, "a finite number");
  return v;
}

// model_overrides: a mapping of HF config.json fields, kept as JSON text.
void set_model_overrides(TrainConfig& c, const YAML::Node& n, const std::string& source) {
  if (n.IsNull() || (n.IsScalar() && n.Scalar().empty())) {
    c.model.overrides.clear();
    return;
  }
  LT_CHECK(n.IsMap(), "{}: key 'model_overrides' expects a mapping of config.json fields, got '{}'", source,
           n.IsScalar() ? n.Scalar() : std::string("a list"));
  c.model.overrides = yaml_to_json(n, source).dump();
}

// Sets one field from a YAML node, with type checking. YAML scalars are untyped text, so
// the expected type decides how to read them; a mismatch names key, expected and actual.
void set_field(TrainConfig& c, const Field& f, const YAML::Node& n, const std::string& source, PendingText& pending) {
  if (std::string(f.key) == "model_overrides") return set_model_overrides(c, n, source);
  const Slot slot = f.slot(c);
  if (!n.IsScalar() && !n.IsNull()) bad_value(f, n, source, expected_type(slot));
  const std::string text = n.IsNull() ? std::string() : n.Scalar();
  if (auto* p = std::get_if<std::string*>(&slot)) {
    **p = text;
  } else if (auto* b = std::get_if<bool*>(&slot)) {
    bool v;
    if (n.IsNull() || !YAML::convert<bool>::decode(n, v)) bad_value(f, n, source, "a boolean (true/false)");
    **b = v;
  } else if (auto* i = std::get_if<int64_t*>(&slot)) {
    **i = integer_of(f, n, source);
  } else if (auto* d = std::get_if<double*>(&slot)) {
    **d = number_of(f, n, source);
  } else {
    pending[&f] = {text, source};
  }
}

void parse_pending(TrainConfig& c, const PendingText& pending) {
  for (const auto& [f, value] : pending) std::get<TextSlot>(f->slot(c)).parse(value.first, value.second);
}

}  // namespace

const std::vector<std::string>& config_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& f : config_fields()) k.push_back(f.key);
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

namespace {

void read_yaml(TrainConfig& c, const std::string& yaml_text, const std::string& source, PendingText& pending) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    fail("{}: invalid YAML at line {}, column {}: {}", source, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  if (!root.IsDefined() || root.IsNull()) return;
  LT_CHECK(root.IsMap(), "{}: expected a mapping of key: value at the top level, got {}", source, node_text(root));
  try {
    for (const auto& [key, kv] : mapping_entries(root, source, "")) {
      const Field* f = find_field(key);
      if (!f) unknown_key(key, source);
      set_field(c, *f, kv.second, fmt::format("{} (line {})", source, line_of(kv.first)), pending);
    }
  } catch (const YAML::Exception& e) {
    fail("{}: line {}, column {}: {}", source, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
}

void apply_override(TrainConfig& c, const std::string& ov, PendingText& pending) {
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
  set_field(c, *f, n, "command line override", pending);
}

}  // namespace

TrainConfig parse_config(const std::string& yaml_text, const std::string& source,
                         const std::vector<std::string>& overrides) {
  TrainConfig c;
  PendingText pending;
  read_yaml(c, yaml_text, source, pending);
  for (const auto& ov : overrides) apply_override(c, ov, pending);
  parse_pending(c, pending);
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
  for (const auto& f : config_fields()) {
    out << YAML::Key << f.key << YAML::Value;
    const Slot s = read_slot(f, c);
    if (const auto* p = std::get_if<std::string*>(&s)) {
      if (std::string(f.key) == "model_overrides" && !(*p)->empty()) emit_json(out, nlohmann::json::parse(**p));
      else out << YAML::DoubleQuoted << **p;
    } else if (const auto* t = std::get_if<TextSlot>(&s)) {
      out << YAML::DoubleQuoted << t->text();
    } else if (const auto* d = std::get_if<double*>(&s)) {
      out << fmt::format("{}", **d);
    } else if (const auto* i = std::get_if<int64_t*>(&s)) {
      out << **i;
    } else {
      out << *std::get<bool*>(s);
    }
  }
  out << YAML::EndMap;
  return out.c_str();
}

}  // namespace lt::train
