// The filters and tests that chat templates use (`x|trim`, `x is defined`), with Jinja's semantics:
// a table from the filter's name to a function of the filtered value, the arguments and the call site.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string_view>

#include "core/error.h"
#include "data/jinja/builtins.h"

namespace lt::data::jinja {

namespace {

// One application of a filter: `v|name(a)` at `at`.
struct FilterCall {
  const Value& v;
  Args& a;
  const CallSite& at;

  Value attr_of(const Value& x, const Value& attr) const { return get_attr(x, str(attr), at.limits.max_string_bytes); }
  // An argument that sizes a string (a width, an indent) passing max_string_bytes is an error naming `what`.
  void check_string_arg(const char* what, int64_t n) const {
    LT_CHECK(n <= at.limits.max_string_bytes, "{}:{}: {} {}: expected at most {} (max_string_bytes)", at.origin,
             at.line, what, n, at.limits.max_string_bytes);
  }
};
using Filter = Value (*)(const FilterCall& c);

// ---------------- strings and numbers
Value f_length(const FilterCall& c) { return Value(length(c.v)); }
Value f_trim(const FilterCall& c) { return Value(strip_chars(str(c.v), c.a.get(0, "chars"), true, true)); }
template <Case Mode>
Value f_case(const FilterCall& c) { return Value(case_map(str(c.v), Mode)); }
Value f_string(const FilterCall& c) { return Value(str(c.v)); }
Value f_unchanged(const FilterCall& c) { return c.v; }  // safe, escape: no autoescaping in chat templates
Value f_int(const FilterCall& c) { return Value(to_int(c.v)); }
Value f_float(const FilterCall& c) { return Value(c.v.kind == Value::String ? std::atof(c.v.s.c_str()) : c.v.num()); }

Value f_abs(const FilterCall& c) {
  return c.v.kind == Value::Float ? Value(std::fabs(c.v.f)) : Value(static_cast<int64_t>(std::llabs(to_int(c.v))));
}

Value f_default(const FilterCall& c) {
  const bool boolean = c.a.get(1, "boolean", Value(false)).truthy();
  if (!c.v.defined() || (boolean && !c.v.truthy())) return c.a.get(0, "default_value", Value(""));
  return c.v;
}

Value f_join(const FilterCall& c) {
  const std::string sep = str(c.a.get(0, "d", Value("")));
  const Value attr = c.a.get(1, "attribute");
  return Value(join_items(iterate(c.v), sep, c.at.limits.max_string_bytes,
                          [&](const Value& x) { return str(attr.defined() ? c.attr_of(x, attr) : x); }));
}

Value f_replace(const FilterCall& c) {
  return Value(replace_all(str(c.v), str(c.a.get(0, "old")), str(c.a.get(1, "new")), int_arg(c.a, 2, "count", -1),
                           c.at.limits.max_string_bytes));
}

Value f_tojson(const FilterCall& c) {
  const int64_t indent = std::max<int64_t>(int_arg(c.a, 0, "indent", -1), -1);
  c.check_string_arg("tojson indent", indent);
  return Value(to_json(c.v, static_cast<int>(indent), c.a.get(3, "sort_keys").truthy(),
                       static_cast<size_t>(c.at.limits.max_string_bytes)));
}

Value f_round(const FilterCall& c) {
  const int64_t prec = to_int(c.a.get(0, "precision", Value(int64_t{0})));
  const double m = std::pow(10.0, static_cast<double>(prec));
  return Value(std::round(c.v.num() * m) / m);
}

// Every line of s after `pad` (the first line when `first`, blank lines when `blank`).
std::string indent_lines(const std::string& s, const std::string& pad, bool first, bool blank, int64_t max_bytes) {
  std::string r;
  size_t prev = 0;
  bool is_first = true;
  for (;;) {
    const size_t p = s.find('\n', prev);
    const std::string line = s.substr(prev, p == std::string::npos ? std::string::npos : p - prev);
    if ((!is_first || first) && (blank || !line.empty())) r += pad;
    r += line;
    check_string_size(r.size(), max_bytes);
    if (p == std::string::npos) break;
    r += '\n';
    prev = p + 1;
    is_first = false;
  }
  return r;
}

Value f_indent(const FilterCall& c) {
  const Value w = c.a.get(0, "width", Value(int64_t{4}));
  const int64_t width = w.kind == Value::String ? 0 : std::max<int64_t>(to_int(w), 0);  // Python: ' ' * -1 == ''
  c.check_string_arg("indent width", width);
  const std::string pad = w.kind == Value::String ? w.s : std::string(static_cast<size_t>(width), ' ');
  return Value(indent_lines(str(c.v), pad, c.a.get(1, "first").truthy(), c.a.get(2, "blank").truthy(),
                            c.at.limits.max_string_bytes));
}

Value f_wordcount(const FilterCall& c) {
  return Value(static_cast<int64_t>(split(str(c.v), Value(), -1).list->size()));
}

// ---------------- sequences
Value f_first(const FilterCall& c) {
  const List l = iterate(c.v);
  return l.empty() ? Value() : l.front();
}

Value f_last(const FilterCall& c) {
  const List l = iterate(c.v);
  return l.empty() ? Value() : l.back();
}

Value f_list(const FilterCall& c) { return Value::array(iterate(c.v)); }

Value f_reverse(const FilterCall& c) {
  if (c.v.kind == Value::String) {
    std::u32string t = u32(c.v.s);
    std::reverse(t.begin(), t.end());
    return Value(u8(t));
  }
  List l = iterate(c.v);
  std::reverse(l.begin(), l.end());
  return Value::array(l);
}

Value f_items(const FilterCall& c) {
  const Value items_of = method(c.v, "items", c.at.limits.max_string_bytes);
  return items_of.defined() ? (*items_of.fn)(c.a) : Value::array();
}

Value f_dictsort(const FilterCall& c) {
  const Value items_of = method(c.v, "items", c.at.limits.max_string_bytes);
  LT_CHECK(items_of.defined(), "{}:{}: dictsort needs a dict, got {}", c.at.origin, c.at.line, repr(c.v));
  Value items = (*items_of.fn)(c.a);
  std::sort(items.list->begin(), items.list->end(),
            [](const Value& x, const Value& y) { return less((*x.list)[0], (*y.list)[0]); });
  return items;
}

Value f_sort(const FilterCall& c) {
  List l = iterate(c.v);
  const Value attr = c.a.get(2, "attribute");
  const bool rev = c.a.get(0, "reverse").truthy();
  std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
    const Value xx = attr.defined() ? c.attr_of(x, attr) : x, yy = attr.defined() ? c.attr_of(y, attr) : y;
    return rev ? less(yy, xx) : less(xx, yy);
  });
  return Value::array(l);
}

Value f_unique(const FilterCall& c) {
  List out;
  for (const auto& x : iterate(c.v)) {
    bool seen = false;
    for (const auto& y : out) seen = seen || equal(x, y);
    if (!seen) out.push_back(x);
  }
  return Value::array(out);
}

Value f_sum(const FilterCall& c) {
  Value acc(int64_t{0});
  for (const auto& x : iterate(c.v))
    acc = (acc.kind == Value::Float || x.kind == Value::Float) ? Value(acc.num() + x.num()) : Value(acc.i + to_int(x));
  return acc;
}

// min (Max false) or max: the first extreme item, undefined for an empty sequence.
template <bool Max>
Value f_extreme(const FilterCall& c) {
  const List l = iterate(c.v);
  if (l.empty()) return Value();
  Value best = l[0];
  for (const auto& x : l)
    if (Max ? less(best, x) : less(x, best)) best = x;
  return best;
}

// map(attribute=...) takes that attribute of every item; map('filter', args...) applies that filter.
Value f_map(const FilterCall& c) {
  const Value attr = c.a.get(99, "attribute");
  Value out = Value::array();
  for (const auto& x : iterate(c.v)) {
    if (attr.defined()) {
      Value r = c.attr_of(x, attr);
      if (!r.defined()) r = c.a.get(99, "default");
      out.list->push_back(r);
    } else {
      Args rest;
      rest.pos.assign(c.a.pos.begin() + std::min<size_t>(1, c.a.pos.size()), c.a.pos.end());
      out.list->push_back(apply_filter(str(c.a.get(0, "filter")), x, rest, c.at));
    }
  }
  return out;
}

// select/reject (ByAttr false) and selectattr/rejectattr: the items whose subject passes the test named by
// the next positional argument (else is truthy) when Keep, fails it when not.
template <bool ByAttr, bool Keep>
Value f_select(const FilterCall& c) {
  const size_t base = ByAttr ? 1 : 0;
  Value out = Value::array();
  for (const auto& x : iterate(c.v)) {
    const Value subj = ByAttr ? c.attr_of(x, c.a.get(0, "attribute")) : x;
    bool ok;
    if (c.a.pos.size() > base) {
      Args ta;
      ta.pos.assign(c.a.pos.begin() + static_cast<std::ptrdiff_t>(base) + 1, c.a.pos.end());
      ok = apply_test(str(c.a.pos[base]), subj, ta, c.at);
    } else {
      ok = subj.truthy();
    }
    if (ok == Keep) out.list->push_back(x);
  }
  return out;
}

Value f_batch(const FilterCall& c) {
  const int64_t n = to_int(c.a.get(0, "linecount"));
  Value out = Value::array();
  for (const auto& x : iterate(c.v)) {
    if (out.list->empty() || static_cast<int64_t>(out.list->back().list->size()) >= n)
      out.list->push_back(Value::array());
    out.list->back().list->push_back(x);
  }
  return out;
}

const std::map<std::string_view, Filter>& filters() {
  static const std::map<std::string_view, Filter> table = {
      {"length", f_length},       {"count", f_length},
      {"trim", f_trim},           {"upper", f_case<Case::Upper>},
      {"lower", f_case<Case::Lower>}, {"title", f_case<Case::Title>},
      {"capitalize", f_case<Case::Capitalize>},
      {"string", f_string},       {"safe", f_unchanged},
      {"e", f_unchanged},         {"escape", f_unchanged},
      {"forceescape", f_unchanged}, {"int", f_int},
      {"float", f_float},         {"abs", f_abs},
      {"default", f_default},     {"d", f_default},
      {"first", f_first},         {"last", f_last},
      {"list", f_list},           {"reverse", f_reverse},
      {"join", f_join},           {"replace", f_replace},
      {"tojson", f_tojson},       {"items", f_items},
      {"dictsort", f_dictsort},   {"sort", f_sort},
      {"unique", f_unique},       {"sum", f_sum},
      {"min", f_extreme<false>},  {"max", f_extreme<true>},
      {"round", f_round},         {"indent", f_indent},
      {"wordcount", f_wordcount}, {"map", f_map},
      {"select", f_select<false, true>},     {"reject", f_select<false, false>},
      {"selectattr", f_select<true, true>},  {"rejectattr", f_select<true, false>},
      {"batch", f_batch},
  };
  return table;
}

// "x in seq": a substring of a string, else an item of the sequence.
bool is_in(const Value& v, const Value& seq) {
  if (seq.kind == Value::String) return v.kind == Value::String && seq.s.find(v.s) != std::string::npos;
  for (const auto& x : iterate(seq))
    if (equal(x, v)) return true;
  return false;
}

}  // namespace

Value apply_filter(const std::string& name, const Value& v, Args& a, const CallSite& at) {
  const auto& table = filters();
  const auto it = table.find(name);
  if (it == table.end()) fail("{}:{}: unknown filter '{}'", at.origin, at.line, name);
  return it->second(FilterCall{v, a, at});
}

bool apply_test(const std::string& t, const Value& v, Args& a, const CallSite& at) {
  if (t == "defined") return v.defined();
  if (t == "undefined") return !v.defined();
  if (t == "none") return v.is_none();
  if (t == "boolean") return v.kind == Value::Bool;
  if (t == "true") return v.kind == Value::Bool && v.b;
  if (t == "false") return v.kind == Value::Bool && !v.b;
  if (t == "integer") return v.kind == Value::Int;
  if (t == "float") return v.kind == Value::Float;
  if (t == "number") return v.is_number();
  if (t == "string") return v.kind == Value::String;
  if (t == "mapping") return v.kind == Value::Object;
  if (t == "iterable") return v.kind == Value::Array || v.kind == Value::Object || v.kind == Value::String;
  if (t == "sequence") return v.kind == Value::Array || v.kind == Value::String || v.kind == Value::Object;
  if (t == "callable") return v.kind == Value::Function;
  if (t == "odd") return to_int(v) % 2 != 0;
  if (t == "even") return to_int(v) % 2 == 0;
  if (t == "divisibleby") return to_int(a.get(0, "num")) != 0 && to_int(v) % to_int(a.get(0, "num")) == 0;
  if (t == "eq" || t == "equalto" || t == "==" || t == "sameas") return equal(v, a.get(0, "other"));
  if (t == "ne" || t == "!=") return !equal(v, a.get(0, "other"));
  if (t == "lt" || t == "lessthan" || t == "<") return less(v, a.get(0, "other"));
  if (t == "gt" || t == "greaterthan" || t == ">") return less(a.get(0, "other"), v);
  if (t == "le" || t == "<=") return !less(a.get(0, "other"), v);
  if (t == "ge" || t == ">=") return !less(v, a.get(0, "other"));
  if (t == "in") return is_in(v, a.get(0, "seq"));
  if (t == "lower") return str(v) == case_map(str(v), Case::Lower);
  if (t == "upper") return str(v) == case_map(str(v), Case::Upper);
  fail("{}:{}: unknown test '{}'", at.origin, at.line, t);
}

}  // namespace lt::data::jinja
