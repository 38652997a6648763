// Helpers shared by the component parsers (JSON field access with path-naming errors) and the
// split-behaviour logic of HF's NormalizedString::split.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lt::data::detail {

using json = nlohmann::json;

inline const json& field(const json& j, const char* name, const std::string& where) {
  auto it = j.find(name);
  LT_CHECK(it != j.end(), "{}: missing field '{}'", where, name);
  return *it;
}
inline std::string get_str(const json& j, const char* name, const std::string& where) {
  const json& v = field(j, name, where);
  LT_CHECK(v.is_string(), "{}.{}: expected a string, got {}", where, name, v.type_name());
  return v.get<std::string>();
}
inline std::string opt_str(const json& j, const char* name, const std::string& def, const std::string& where) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return def;
  LT_CHECK(it->is_string(), "{}.{}: expected a string, got {}", where, name, it->type_name());
  return it->get<std::string>();
}
inline bool get_bool(const json& j, const char* name, bool def, const std::string& where) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return def;
  LT_CHECK(it->is_boolean(), "{}.{}: expected true/false, got {}", where, name, it->type_name());
  return it->get<bool>();
}
inline int64_t get_int(const json& j, const char* name, int64_t def, const std::string& where) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return def;
  LT_CHECK(it->is_number_integer(), "{}.{}: expected an integer, got {}", where, name, it->type_name());
  return it->get<int64_t>();
}
inline std::string type_of(const json& j, const std::string& where) {
  LT_CHECK(j.is_object(), "{}: expected an object, got {}", where, j.type_name());
  return get_str(j, "type", where);
}

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
SplitBehavior parse_behavior(const std::string& s, const std::string& where);

// One range of a piece and whether it is a match (HF's find_matches output, covering the piece).
using Match = std::pair<std::pair<uint32_t, uint32_t>, bool>;
// Applies a split behaviour to matches covering [b, e) and appends the kept non-empty ranges.
void apply_behavior(std::vector<Match>& m, SplitBehavior beh, std::vector<std::pair<uint32_t, uint32_t>>& out);

}  // namespace lt::data::detail
