// The value helpers the renderer, filters and methods share, with Python's semantics.
#include "data/jinja/builtins.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "data/unicode.h"

namespace lt::data::jinja {

std::u32string u32(const std::string& s) { return utf8_decode(s).cps; }

std::string u8(const std::u32string& s) {
  std::string o;
  for (char32_t c : s) utf8_append(o, c);
  return o;
}

bool is_space_cp(char32_t c) { return is_whitespace(c); }

void check_string_size(size_t bytes, int64_t max_bytes) {
  if (bytes > size_t(max_bytes))
    fail("a string of {} bytes or more exceeds the limit of {} bytes (max_string_bytes)", bytes, max_bytes);
}

int64_t int_arg(const Args& a, size_t n, const char* name, int64_t def) {
  const Value v = a.get(n, name);
  return v.kind == Value::Int ? v.i : def;
}

int64_t to_int(const Value& v) {
  if (v.kind == Value::Int) return v.i;
  if (v.kind == Value::Float) return static_cast<int64_t>(v.f);
  if (v.kind == Value::Bool) return v.b;
  if (v.kind == Value::String) {
    try {
      return std::stoll(v.s);
    } catch (...) {
      return 0;
    }
  }
  return 0;
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.num() < b.num();
  if (a.kind == Value::String && b.kind == Value::String) return a.s < b.s;
  if (a.kind == Value::Array && b.kind == Value::Array) {
    for (size_t k = 0; k < std::min(a.list->size(), b.list->size()); ++k) {
      if (less((*a.list)[k], (*b.list)[k])) return true;
      if (less((*b.list)[k], (*a.list)[k])) return false;
    }
    return a.list->size() < b.list->size();
  }
  fail("cannot compare {} and {}", repr(a), repr(b));
}

List iterate(const Value& v) {
  switch (v.kind) {
    case Value::Array: return *v.list;
    case Value::Object: {
      List l;
      for (const auto& kv : v.dict->items) l.push_back(Value(kv.first));
      return l;
    }
    case Value::String: {
      List l;
      for (char32_t c : u32(v.s)) {
        std::string s;
        utf8_append(s, c);
        l.push_back(Value(s));
      }
      return l;
    }
    case Value::Undefined: case Value::None: return {};
    default: fail("'{}' is not iterable", repr(v));
  }
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Value::String: return static_cast<int64_t>(u32(v.s).size());
    case Value::Array: return static_cast<int64_t>(v.list->size());
    case Value::Object: return static_cast<int64_t>(v.dict->items.size());
    case Value::Undefined: return 0;
    default: fail("object of type {} has no len()", repr(v));
  }
}

std::string case_map(const std::string& s, Case mode) {
  std::string out;
  bool prev_cased = false;
  const std::u32string t = u32(s);
  for (size_t i = 0; i < t.size(); ++i) {
    char32_t c = t[i];
    bool up;
    if (mode == Case::Lower) up = false;
    else if (mode == Case::Upper) up = true;
    else if (mode == Case::Title) up = !prev_cased;
    else up = i == 0;
    // ASCII fast and exact; other scripts through simple case mapping of the common ranges.
    if (c < 0x80) c = up ? static_cast<char32_t>(std::toupper(static_cast<int>(c))) : static_cast<char32_t>(std::tolower(static_cast<int>(c)));
    prev_cased = is_letter(t[i]);
    utf8_append(out, c);
  }
  return out;
}

std::string strip_chars(const std::string& s, const Value& chars, bool left, bool right) {
  const std::u32string t = u32(s);
  const std::u32string set = chars.kind == Value::String ? u32(chars.s) : std::u32string();
  auto strip = [&](char32_t c) { return chars.kind == Value::String ? set.find(c) != std::u32string::npos : is_space_cp(c); };
  size_t b = 0, e = t.size();
  if (left) while (b < e && strip(t[b])) ++b;
  if (right) while (e > b && strip(t[e - 1])) --e;
  return u8(t.substr(b, e - b));
}

namespace {

// Python's str.split() without a separator: whitespace runs, empties dropped.
Value split_whitespace(const std::string& s, int64_t maxsplit) {
  Value out = Value::array();
  const std::u32string t = u32(s);
  size_t i = 0;
  int64_t n = 0;
  while (i < t.size()) {
    while (i < t.size() && is_space_cp(t[i])) ++i;
    if (i >= t.size()) break;
    if (maxsplit >= 0 && n == maxsplit) {
      size_t e = t.size();
      while (e > i && is_space_cp(t[e - 1])) --e;
      out.list->push_back(Value(u8(t.substr(i, e - i))));
      break;
    }
    size_t j = i;
    while (j < t.size() && !is_space_cp(t[j])) ++j;
    out.list->push_back(Value(u8(t.substr(i, j - i))));
    ++n;
    i = j;
  }
  return out;
}

}  // namespace

Value split(const std::string& s, const Value& sep, int64_t maxsplit) {
  if (sep.kind != Value::String) return split_whitespace(s, maxsplit);
  LT_CHECK(!sep.s.empty(), "split: empty separator");
  Value out = Value::array();
  size_t prev = 0;
  int64_t n = 0;
  for (size_t p = s.find(sep.s); p != std::string::npos && (maxsplit < 0 || n < maxsplit); p = s.find(sep.s, prev)) {
    out.list->push_back(Value(s.substr(prev, p - prev)));
    prev = p + sep.s.size();
    ++n;
  }
  out.list->push_back(Value(s.substr(prev)));
  return out;
}

std::string replace_all(const std::string& s, const std::string& a, const std::string& b, int64_t count,
                        int64_t max_bytes) {
  if (a.empty()) return s;
  std::string out;
  size_t prev = 0;
  int64_t n = 0;
  for (size_t p = s.find(a); p != std::string::npos && (count < 0 || n < count); p = s.find(a, prev)) {
    out += s.substr(prev, p - prev) + b;
    check_string_size(out.size(), max_bytes);
    prev = p + a.size();
    ++n;
  }
  return out + s.substr(prev);
}

}  // namespace lt::data::jinja
