// The methods of strings and dicts that chat templates call (s.strip(), d.items(), ...), with Python's
// semantics: a table from the method's name to a function of the bound object and the call's arguments.
#include <map>
#include <string_view>

#include "core/error.h"
#include "data/jinja/builtins.h"
#include "data/unicode.h"

namespace lt::data::jinja {

namespace {

// ---------------- str methods: f(the string, the call's arguments, max_string_bytes)
using StringMethod = Value (*)(const std::string& s, Args& a, int64_t max_bytes);

Value str_strip(const std::string& s, Args& a, int64_t) { return Value(strip_chars(s, a.get(0, "chars"), true, true)); }
Value str_lstrip(const std::string& s, Args& a, int64_t) { return Value(strip_chars(s, a.get(0, "chars"), true, false)); }
Value str_rstrip(const std::string& s, Args& a, int64_t) { return Value(strip_chars(s, a.get(0, "chars"), false, true)); }

Value str_split(const std::string& s, Args& a, int64_t) {
  return split(s, a.get(0, "sep"), int_arg(a, 1, "maxsplit", -1));
}

bool has_prefix(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool has_suffix(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// Whether s has one of the strings of the `prefix` argument (a string or a list) at the end `at_end` says.
Value has_affix(const std::string& s, Args& a, bool at_end) {
  const Value p = a.get(0, "prefix");
  const List cands = p.kind == Value::Array ? *p.list : List{p};
  for (const auto& c : cands)
    if (c.kind == Value::String && (at_end ? has_suffix(s, c.s) : has_prefix(s, c.s))) return Value(true);
  return Value(false);
}
Value str_startswith(const std::string& s, Args& a, int64_t) { return has_affix(s, a, false); }
Value str_endswith(const std::string& s, Args& a, int64_t) { return has_affix(s, a, true); }

Value str_replace(const std::string& s, Args& a, int64_t max_bytes) {
  return Value(replace_all(s, str(a.get(0, "old")), str(a.get(1, "new")), int_arg(a, 2, "count", -1), max_bytes));
}

Value str_upper(const std::string& s, Args&, int64_t) { return Value(case_map(s, Case::Upper)); }
Value str_lower(const std::string& s, Args&, int64_t) { return Value(case_map(s, Case::Lower)); }
Value str_title(const std::string& s, Args&, int64_t) { return Value(case_map(s, Case::Title)); }
Value str_capitalize(const std::string& s, Args&, int64_t) { return Value(case_map(s, Case::Capitalize)); }

// The character index of `sub` in s (found by `find`), or -1; `index` makes a miss an error.
template <bool Reverse, bool MissIsError>
Value str_find(const std::string& s, Args& a, int64_t) {
  const std::string sub = str(a.get(0, "sub"));
  const size_t p = Reverse ? s.rfind(sub) : s.find(sub);
  if (p == std::string::npos) {
    LT_CHECK(!MissIsError, "substring not found");
    return Value(int64_t{-1});
  }
  return Value(static_cast<int64_t>(u32(s.substr(0, p)).size()));
}

Value str_count(const std::string& s, Args& a, int64_t) {
  const std::string sub = str(a.get(0, "sub"));
  if (sub.empty()) return Value(length(Value(s)) + 1);
  int64_t n = 0;
  for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
  return Value(n);
}

Value str_join(const std::string& s, Args& a, int64_t max_bytes) {
  return Value(join_items(iterate(a.get(0, "iterable")), s, max_bytes, [](const Value& x) { return str(x); }));
}

Value str_splitlines(const std::string& s, Args&, int64_t) {
  Value out = Value::array();
  size_t prev = 0;
  for (size_t p = 0; p < s.size(); ++p) {
    if (s[p] == '\n' || s[p] == '\r') {
      out.list->push_back(Value(s.substr(prev, p - prev)));
      if (s[p] == '\r' && p + 1 < s.size() && s[p + 1] == '\n') ++p;
      prev = p + 1;
    }
  }
  if (prev < s.size()) out.list->push_back(Value(s.substr(prev)));
  return out;
}

Value str_removeprefix(const std::string& s, Args& a, int64_t) {
  const std::string x = str(a.get(0, "x"));
  return Value(has_prefix(s, x) ? s.substr(x.size()) : s);
}
Value str_removesuffix(const std::string& s, Args& a, int64_t) {
  const std::string x = str(a.get(0, "x"));
  return Value(has_suffix(s, x) ? s.substr(0, s.size() - x.size()) : s);
}

// Python's str.isdigit() and the like: s is not empty and every character passes `ok`.
template <bool (*Ok)(char32_t)>
Value str_all_chars(const std::string& s, Args&, int64_t) {
  const std::u32string t = u32(s);
  if (t.empty()) return Value(false);
  for (char32_t c : t)
    if (!Ok(c)) return Value(false);
  return Value(true);
}
bool is_digit_cp(char32_t c) { return is_number(c); }
bool is_letter_cp(char32_t c) { return is_letter(c); }
bool not_ascii_lower(char32_t c) { return !(c >= 'a' && c <= 'z'); }
bool not_ascii_upper(char32_t c) { return !(c >= 'A' && c <= 'Z'); }

// "{}" placeholders replaced by the positional arguments in order.
Value str_format(const std::string& s, Args& a, int64_t) {
  std::string r;
  size_t k = 0;
  for (size_t p = 0; p < s.size(); ++p) {
    if (s[p] == '{' && p + 1 < s.size() && s[p + 1] == '}') {
      r += str(a.get(k++, ""));
      ++p;
    } else {
      r += s[p];
    }
  }
  return Value(r);
}

const std::map<std::string_view, StringMethod>& string_methods() {
  static const std::map<std::string_view, StringMethod> table = {
      {"strip", str_strip},
      {"lstrip", str_lstrip},
      {"rstrip", str_rstrip},
      {"split", str_split},
      {"startswith", str_startswith},
      {"endswith", str_endswith},
      {"replace", str_replace},
      {"upper", str_upper},
      {"lower", str_lower},
      {"title", str_title},
      {"capitalize", str_capitalize},
      {"find", str_find<false, false>},
      {"rfind", str_find<true, false>},
      {"index", str_find<false, true>},
      {"count", str_count},
      {"join", str_join},
      {"splitlines", str_splitlines},
      {"removeprefix", str_removeprefix},
      {"removesuffix", str_removesuffix},
      {"isdigit", str_all_chars<is_digit_cp>},
      {"isspace", str_all_chars<is_space_cp>},
      {"isalpha", str_all_chars<is_letter_cp>},
      {"isupper", str_all_chars<not_ascii_lower>},
      {"islower", str_all_chars<not_ascii_upper>},
      {"format", str_format},
  };
  return table;
}

// ---------------- dict methods: f(the dict, the call's arguments)
using DictMethod = Value (*)(const Dict& d, Args& a);

Value dict_items(const Dict& d, Args&) {
  Value v = Value::array();
  for (const auto& [k, x] : d.items) v.list->push_back(Value::array({Value(k), x}));
  return v;
}

Value dict_keys(const Dict& d, Args&) {
  Value v = Value::array();
  for (const auto& kv : d.items) v.list->push_back(Value(kv.first));
  return v;
}

Value dict_values(const Dict& d, Args&) {
  Value v = Value::array();
  for (const auto& kv : d.items) v.list->push_back(kv.second);
  return v;
}

Value dict_get(const Dict& d, Args& a) {
  const Value* v = d.find(str(a.get(0, "key")));
  return v ? *v : a.get(1, "default", Value::none());
}

const std::map<std::string_view, DictMethod>& dict_methods() {
  static const std::map<std::string_view, DictMethod> table = {
      {"items", dict_items},
      {"keys", dict_keys},
      {"values", dict_values},
      {"get", dict_get},
  };
  return table;
}

}  // namespace

Value method(const Value& o, const std::string& name, int64_t max_string_bytes) {
  if (o.kind == Value::String) {
    const auto& table = string_methods();
    const auto it = table.find(name);
    if (it == table.end()) return Value();
    return Value::function([s = o.s, f = it->second, max_string_bytes](Args& a) { return f(s, a, max_string_bytes); });
  }
  if (o.kind == Value::Object && !o.is_namespace) {
    const auto& table = dict_methods();
    const auto it = table.find(name);
    if (it == table.end()) return Value();
    return Value::function([d = o.dict, f = it->second](Args& a) { return f(*d, a); });
  }
  return Value();
}

Value get_attr(const Value& o, const std::string& name, int64_t max_string_bytes) {
  Value m = method(o, name, max_string_bytes);
  if (m.defined()) return m;
  if (o.kind == Value::Object) {
    const Value* v = o.dict->find(name);
    return v ? *v : Value();
  }
  return Value();
}

}  // namespace lt::data::jinja
