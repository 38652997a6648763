// The interpreter's built-in filters, tests and methods (filters.cpp, methods.cpp) and the value helpers
// they share with the renderer (builtins.cpp). Internal to src/data/jinja.
#pragma once
#include <cstdint>
#include <string>

#include "data/jinja/ast.h"
#include "data/jinja/value.h"

namespace lt::data::jinja {

// Where a filter or test is applied: the template's origin and line (what errors name) and its limits.
struct CallSite {
  const std::string& origin;
  const Limits& limits;
  int line;
};

// The filter or test `name` applied to v with arguments a; an unknown name is an error naming the site.
Value apply_filter(const std::string& name, const Value& v, Args& a, const CallSite& at);
bool apply_test(const std::string& name, const Value& v, Args& a, const CallSite& at);
// The method `name` of a string or a dict (not a namespace) bound to o, else undefined; strings it builds
// stay within max_string_bytes.
Value method(const Value& o, const std::string& name, int64_t max_string_bytes);
// o.name: a method, else a dict's entry, else undefined.
Value get_attr(const Value& o, const std::string& name, int64_t max_string_bytes);

// The integer argument n (or keyword `name`), else def when it is absent or not an int.
int64_t int_arg(const Args& a, size_t n, const char* name, int64_t def);

// ---------------- value helpers with Python's semantics
std::u32string u32(const std::string& s);
std::string u8(const std::u32string& s);
bool is_space_cp(char32_t c);
// A string being built passed Limits::max_string_bytes (the render adds the template's origin).
void check_string_size(size_t bytes, int64_t max_bytes);
int64_t to_int(const Value& v);
bool less(const Value& a, const Value& b);
// Iterating a value: lists, dict keys, string characters.
List iterate(const Value& v);
int64_t length(const Value& v);

enum class Case { Lower, Upper, Title, Capitalize };
std::string case_map(const std::string& s, Case mode);
std::string strip_chars(const std::string& s, const Value& chars, bool left, bool right);
Value split(const std::string& s, const Value& sep, int64_t maxsplit);
std::string replace_all(const std::string& s, const std::string& a, const std::string& b, int64_t count,
                        int64_t max_bytes);

// The items of `items` converted by `to_str`, separated by `sep`, within max_bytes.
template <typename ToStr>
std::string join_items(const List& items, const std::string& sep, int64_t max_bytes, ToStr to_str) {
  std::string r;
  bool first = true;
  for (const auto& x : items) {
    if (!first) r += sep;
    r += to_str(x);
    check_string_size(r.size(), max_bytes);
    first = false;
  }
  return r;
}

}  // namespace lt::data::jinja
