// Typed access to the fields of an HF config.json with messages that name the file and the field
// (shared by the family parsers of model_config.cpp and qwen35_config.cpp; internal to src/model).
#pragma once
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/error.h"
#include "model/model_config.h"

namespace lt::config_detail {

using nlohmann::json;

inline std::string type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    case json::value_t::number_float: return "number";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    default: return "unknown";
  }
}

inline std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Typed field access with messages of the form
//   "<file>: field 'hidden_size': expected integer, got string "abc"".
struct Fields {
  const json& j;
  const std::string& src;
  std::string prefix = "";  // "text_config." for a nested config: messages name the full path
  std::set<std::string>* read = nullptr;  // when set, every field looked up is added (with its prefix)
  std::string key(const char* k) const { return prefix + k; }

  const json* get(const char* k) const {
    if (read) read->insert(key(k));
    auto it = j.find(k);
    return it == j.end() ? nullptr : &*it;
  }
  [[noreturn]] void bad(const char* k, const char* expected, const json& v) const {
    fail("{}: field '{}': expected {}, got {} {}", src, key(k), expected, type_name(v), shown(v));
  }
  [[noreturn]] void missing(const char* k, const char* expected) const {
    fail("{}: required field '{}' ({}) is missing", src, key(k), expected);
  }
  int64_t integer(const json& v, const char* k) const {
    if (v.is_number_integer() || v.is_number_unsigned()) return v.get<int64_t>();
    // 4096.0 written by some tools is still an integer value
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::fabs(d) < 9.0e18 && d == std::trunc(d)) return static_cast<int64_t>(d);
    }
    bad(k, "integer", v);
  }
  int64_t req_int(const char* k) const {
    auto* v = get(k);
    if (!v || v->is_null()) missing(k, "integer");
    return integer(*v, k);
  }
  int64_t pos_int(const char* k) const {
    int64_t x = req_int(k);
    LT_CHECK(x > 0, "{}: field '{}': expected a positive integer, got {}", src, key(k), x);
    return x;
  }
  int64_t opt_int(const char* k, int64_t dflt) const {
    auto* v = get(k);
    if (!v || v->is_null()) return dflt;
    return integer(*v, k);
  }
  double number(const json& v, const char* k) const {
    if (!v.is_number()) bad(k, "number", v);
    return v.get<double>();
  }
  double opt_num(const char* k, double dflt) const {
    auto* v = get(k);
    if (!v || v->is_null()) return dflt;
    return number(*v, k);
  }
  bool opt_bool(const char* k, bool dflt) const {
    auto* v = get(k);
    if (!v || v->is_null()) return dflt;
    if (!v->is_boolean()) bad(k, "boolean", *v);
    return v->get<bool>();
  }
  std::string opt_str(const char* k, const std::string& dflt) const {
    auto* v = get(k);
    if (!v || v->is_null()) return dflt;
    if (!v->is_string()) bad(k, "string", *v);
    return v->get<std::string>();
  }
  // Token ids: integer, null (-1), or a list of integers (first taken; eos often is a list).
  int64_t token_id(const char* k, int64_t dflt) const {
    auto* v = get(k);
    if (!v) return dflt;
    if (v->is_null()) return -1;
    if (v->is_array()) {
      if (v->empty()) return -1;
      return integer((*v)[0], k);
    }
    return integer(*v, k);
  }
};

// The fields every family's config.json shares (architectures, model_type, shapes, norms, tying).
json shape_fields(const ModelConfig& c);

}  // namespace lt::config_detail
