// Values of the Jinja interpreter, with Python's semantics where chat templates rely on them
// (truthiness, ==, str() and repr() formatting, int/float arithmetic).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace lt::data::jinja {

struct Value;
using List = std::vector<Value>;
struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, as Python dicts
  const Value* find(const std::string& k) const;
  Value* find(const std::string& k);
  void set(const std::string& k, Value v);
};
struct Args;
using Func = std::function<Value(Args&)>;

struct Value {
  enum Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Function };
  Kind kind = Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Func> fn;
  bool is_namespace = false;

  Value() = default;
  static Value none() { Value v; v.kind = None; return v; }
  Value(bool x) : kind(Bool), b(x) {}
  Value(int64_t x) : kind(Int), i(x) {}
  Value(int x) : kind(Int), i(x) {}
  Value(double x) : kind(Float), f(x) {}
  Value(std::string x) : kind(String), s(std::move(x)) {}
  Value(const char* x) : kind(String), s(x) {}
  static Value array(List l = {}) { Value v; v.kind = Array; v.list = std::make_shared<List>(std::move(l)); return v; }
  static Value object() { Value v; v.kind = Object; v.dict = std::make_shared<Dict>(); return v; }
  static Value function(Func f) { Value v; v.kind = Function; v.fn = std::make_shared<Func>(std::move(f)); return v; }

  bool defined() const { return kind != Undefined; }
  bool is_none() const { return kind == None; }
  bool is_number() const { return kind == Int || kind == Float; }
  double num() const { return kind == Float ? f : kind == Bool ? (b ? 1 : 0) : static_cast<double>(i); }
  bool truthy() const;
};

// Call arguments: positional, then keyword.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // The n-th positional argument or the keyword `name`, else `def`.
  Value get(size_t n, const char* name, Value def = Value()) const;
};

bool equal(const Value& a, const Value& b);
// Python str() and repr().
std::string str(const Value& v);
std::string repr(const Value& v);
// Python json.dumps(v, ensure_ascii=False, indent=indent (<0: None), separators default, sort_keys);
// lt::Error when the indented text would pass max_bytes.
std::string to_json(const Value& v, int indent, bool sort_keys = false, size_t max_bytes = SIZE_MAX);
// JSON -> Value. Use ordered_json for messages: dict keys then keep their input order, as in Python
// (what `message|tojson` and `message.items()` show); nlohmann::json sorts them.
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);

}  // namespace lt::data::jinja
