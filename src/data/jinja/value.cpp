#include "data/jinja/value.h"

#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lt::data::jinja {

const Value* Dict::find(const std::string& k) const {
  for (const auto& [key, v] : items)
    if (key == k) return &v;
  return nullptr;
}
Value* Dict::find(const std::string& k) {
  for (auto& [key, v] : items)
    if (key == k) return &v;
  return nullptr;
}
void Dict::set(const std::string& k, Value v) {
  if (Value* p = find(k)) *p = std::move(v);
  else items.emplace_back(k, std::move(v));
}

bool Value::truthy() const {
  switch (kind) {
    case Undefined: case None: return false;
    case Bool: return b;
    case Int: return i != 0;
    case Float: return f != 0;
    case String: return !s.empty();
    case Array: return !list->empty();
    case Object: return !dict->items.empty();
    case Function: return true;
  }
  return false;
}

Value Args::get(size_t n, const char* name, Value def) const {
  if (n < pos.size()) return pos[n];
  for (const auto& [k, v] : kw)
    if (k == name) return v;
  return def;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.num() == b.num();
  if ((a.kind == Value::Bool || a.is_number()) && (b.kind == Value::Bool || b.is_number())) return a.num() == b.num();
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Undefined: case Value::None: return true;
    case Value::String: return a.s == b.s;
    case Value::Array:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::Object:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    case Value::Function: return a.fn == b.fn;
    default: return false;
  }
}

namespace {
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);  // shortest round-trip, like Python's repr
  std::string s(buf, r.ptr);
  const auto e = s.find('e');
  if (e != std::string::npos) {  // Python: 1e+16, 1e-05
    std::string mant = s.substr(0, e), ex = s.substr(e + 1);
    const bool neg = ex[0] == '-';
    if (ex[0] == '-' || ex[0] == '+') ex = ex.substr(1);
    if (ex.size() < 2) ex = "0" + ex;
    // Python switches to exponent notation only for exp < -4 or >= 16.
    const int exp = std::stoi(std::string(neg ? "-" : "") + ex);
    if (exp >= -4 && exp < 16) {
      char b2[64];
      auto r2 = std::to_chars(b2, b2 + sizeof b2, d, std::chars_format::fixed);
      s.assign(b2, r2.ptr);
      if (s.find('.') == std::string::npos) s += ".0";
      return s;
    }
    return mant + "e" + (neg ? "-" : "+") + ex;
  }
  if (s.find('.') == std::string::npos) s += ".0";
  return s;
}

std::string str_repr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(q)) { out += '\\'; out += q; }
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out.push_back(static_cast<char>(c));
  }
  out += q;
  return out;
}

void json_str(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7f) out += fmt::format("\\u{:04x}", c);
        else out.push_back(static_cast<char>(c));
    }
  }
  out += '"';
}

void to_json_rec(std::string& out, const Value& v, int indent, int level, bool sort_keys, size_t max_bytes) {
  auto nl = [&](int lv) {
    if (indent >= 0) {
      const size_t pad = static_cast<size_t>(indent) * static_cast<size_t>(lv);
      if (out.size() + 1 + pad > max_bytes)
        fail("tojson: the JSON text exceeds the limit of {} bytes (max_string_bytes)", max_bytes);
      out += '\n';
      out.append(pad, ' ');
    }
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case Value::Undefined: case Value::None: out += "null"; return;
    case Value::Bool: out += v.b ? "true" : "false"; return;
    case Value::Int: out += std::to_string(v.i); return;
    case Value::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : float_repr(v.f);
      return;
    case Value::String: json_str(out, v.s); return;
    case Value::Array: {
      if (v.list->empty()) { out += "[]"; return; }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        nl(level + 1);
        to_json_rec(out, (*v.list)[k], indent, level + 1, sort_keys, max_bytes);
      }
      nl(level);
      out += ']';
      return;
    }
    case Value::Object: {
      if (v.dict->items.empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys) std::sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        nl(level + 1);
        json_str(out, items[k]->first);
        out += ": ";
        to_json_rec(out, items[k]->second, indent, level + 1, sort_keys, max_bytes);
      }
      nl(level);
      out += '}';
      return;
    }
    case Value::Function: fail("tojson: a function is not JSON serializable");
  }
}
}  // namespace

std::string str(const Value& v) {
  switch (v.kind) {
    case Value::Undefined: return "";
    case Value::None: return "None";
    case Value::Bool: return v.b ? "True" : "False";
    case Value::Int: return std::to_string(v.i);
    case Value::Float: return float_repr(v.f);
    case Value::String: return v.s;
    default: return repr(v);
  }
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Value::String: return str_repr(v.s);
    case Value::Array: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + repr((*v.list)[k]);
      return out + "]";
    }
    case Value::Object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        out += (first ? "" : ", ") + str_repr(k) + ": " + repr(x);
        first = false;
      }
      return out + "}";
    }
    case Value::Function: return "<function>";
    default: return str(v);
  }
}

std::string to_json(const Value& v, int indent, bool sort_keys, size_t max_bytes) {
  std::string out;
  to_json_rec(out, v, indent, 0, sort_keys, max_bytes);
  return out;
}

namespace {
// JSON -> Value; objects keep the order the JSON type iterates in (ordered_json: the input's, as
// Python's json.loads gives HF's templates).
template <typename J>
Value from_json_impl(const J& j) {
  switch (j.type()) {
    case J::value_t::null: return Value::none();
    case J::value_t::boolean: return Value(j.template get<bool>());
    case J::value_t::number_integer:
    case J::value_t::number_unsigned: return Value(j.template get<int64_t>());
    case J::value_t::number_float: return Value(j.template get<double>());
    case J::value_t::string: return Value(j.template get<std::string>());
    case J::value_t::array: {
      Value v = Value::array();
      for (const auto& e : j) v.list->push_back(from_json_impl(e));
      return v;
    }
    case J::value_t::object: {
      Value v = Value::object();
      for (auto it = j.begin(); it != j.end(); ++it) v.dict->items.emplace_back(it.key(), from_json_impl(it.value()));
      return v;
    }
    default: return Value();
  }
}
}  // namespace

Value from_json(const nlohmann::json& j) { return from_json_impl(j); }
Value from_json(const nlohmann::ordered_json& j) { return from_json_impl(j); }

}  // namespace lt::data::jinja
