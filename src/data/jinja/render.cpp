// The Jinja interpreter: statements, expressions, and the filters, tests, globals and methods
// (str, list, dict) that real chat templates use, with Python semantics.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <stdexcept>
#include <string_view>

#include "core/error.h"
#include "data/jinja/template.h"
#include "data/unicode.h"

namespace lt::data::jinja {

namespace {

struct BreakSignal {};
struct ContinueSignal {};

// A string being built passed Limits::max_string_bytes (the render adds the template's origin).
void check_string_size(size_t bytes, int64_t max_bytes) {
  if (bytes > size_t(max_bytes))
    fail("a string of {} bytes or more exceeds the limit of {} bytes (max_string_bytes)", bytes, max_bytes);
}

bool is_space_cp(char32_t c) { return is_whitespace(c); }

std::u32string u32(const std::string& s) { return utf8_decode(s).cps; }
std::string u8(const std::u32string& s) {
  std::string o;
  for (char32_t c : s) utf8_append(o, c);
  return o;
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

Value split(const std::string& s, const Value& sep, int64_t maxsplit) {
  Value out = Value::array();
  if (sep.kind != Value::String) {  // whitespace runs, empties dropped
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
  LT_CHECK(!sep.s.empty(), "split: empty separator");
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

// The items of `items` converted by str() (or `to_str`), separated by `sep`, within max_bytes.
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

std::string case_map(const std::string& s, int mode) {  // 0 lower, 1 upper, 2 title, 3 capitalize
  std::string out;
  bool prev_cased = false;
  const std::u32string t = u32(s);
  for (size_t i = 0; i < t.size(); ++i) {
    char32_t c = t[i];
    bool up;
    if (mode == 0) up = false;
    else if (mode == 1) up = true;
    else if (mode == 2) up = !prev_cased;
    else up = i == 0;
    // ASCII fast and exact; other scripts through simple case mapping of the common ranges.
    if (c < 0x80) c = up ? static_cast<char32_t>(std::toupper(static_cast<int>(c))) : static_cast<char32_t>(std::tolower(static_cast<int>(c)));
    prev_cased = is_letter(t[i]);
    utf8_append(out, c);
  }
  return out;
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

// base ** exp for exp >= 0 by squaring; nullopt when it does not fit an int64.
std::optional<int64_t> int_power(int64_t base, int64_t exp) {
  int64_t result = 1;
  for (;;) {
    if (exp & 1)
      if (__builtin_mul_overflow(result, base, &result)) return std::nullopt;
    exp >>= 1;
    if (exp == 0) return result;
    if (__builtin_mul_overflow(base, base, &base)) return std::nullopt;
  }
}

// Elements of Python's range(start, stop, step), step != 0 (no overflow for any int64 arguments).
__int128 range_size(int64_t start, int64_t stop, int64_t step) {
  const __int128 span = step > 0 ? __int128(stop) - start : __int128(start) - stop;
  const __int128 st = step > 0 ? __int128(step) : -__int128(step);
  return span <= 0 ? 0 : (span + st - 1) / st;
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

// Iterating a value: lists, dict keys, string characters.
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

class Renderer {
 public:
  Renderer(const std::string& origin, const Limits& limits, const Value& ctx) : origin_(origin), lim_(limits) {
    globals_ = Value::object();
    install_globals();
    for (const auto& kv : ctx.dict->items) globals_.dict->set(kv.first, kv.second);
    scopes_.push_back(globals_.dict);
  }

  void run(const Body& b) { exec(b); }
  std::string out;
  std::vector<std::pair<size_t, size_t>> gen;

 private:
  // ---------------- limits
  // One level of render recursion (a statement or an expression being run): bounded by max_render_depth.
  class Level {
   public:
    Level(Renderer& r, int line) : r_(r) {
      LT_CHECK(++r.depth_ <= r.lim_.max_render_depth,
               "{}:{}: the render nests deeper than {} levels (max_render_depth: macro calls, blocks and expressions "
               "together)",
               r.origin_, line, r.lim_.max_render_depth);
    }
    ~Level() { --r_.depth_; }
    Level(const Level&) = delete;
    Level& operator=(const Level&) = delete;

   private:
    Renderer& r_;
  };
  // A macro call in progress: bounded by max_call_depth.
  class MacroCall {
   public:
    MacroCall(Renderer& r, const Node& macro) : r_(r) {
      LT_CHECK(++r.calls_ <= r.lim_.max_call_depth,
               "{}:{}: macro '{}' called inside {} macro calls (max_call_depth {}): a macro that calls itself "
               "without end?",
               r.origin_, macro.line, macro.targets[0], r.calls_ - 1, r.lim_.max_call_depth);
    }
    ~MacroCall() { --r_.calls_; }
    MacroCall(const MacroCall&) = delete;
    MacroCall& operator=(const MacroCall&) = delete;

   private:
    Renderer& r_;
  };
  void count_loop_iteration(int line) {
    LT_CHECK(++iterations_ <= lim_.max_loop_iterations,
             "{}:{}: more than {} for-loop iterations in one render (max_loop_iterations)", origin_, line,
             lim_.max_loop_iterations);
  }
  void check_string(size_t bytes, int line) const {
    LT_CHECK(bytes <= size_t(lim_.max_string_bytes),
             "{}:{}: a string of {} bytes exceeds the limit of {} bytes (max_string_bytes)", origin_, line, bytes,
             lim_.max_string_bytes);
  }
  void append_output(const std::string& s, int line) {
    check_string(out.size() + s.size(), line);
    out += s;
  }
  // Levels of lists, dicts and namespaces in v, counted up to max_nesting + 1; a value holding the dict
  // `into` counts as max_nesting + 1 (setting it into that dict would make a cycle).
  int64_t value_depth(const Value& v, const Dict* into, int64_t level = 1) const {
    if (level > lim_.max_nesting || (v.kind == Value::Object && v.dict.get() == into)) return lim_.max_nesting + 1;
    int64_t d = level;
    if (v.kind == Value::Array)
      for (const auto& x : *v.list) d = std::max(d, value_depth(x, into, level + 1));
    if (v.kind == Value::Object)
      for (const auto& kv : v.dict->items) d = std::max(d, value_depth(kv.second, into, level + 1));
    return d;
  }

  // ---------------- statements
  void exec(const Body& body) {
    for (const auto& n : body) exec(*n);
  }
  void exec(const Node& n) {
    const Level level(*this, n.line);
    switch (n.kind) {
      case Node::Text: append_output(n.text, n.line); return;
      case Node::Output: append_output(str(eval(*n.expr)), n.line); return;
      case Node::If:
        for (const auto& [cond, body] : n.branches) {
          if (!cond || eval(*cond).truthy()) {
            exec(body);
            return;
          }
        }
        return;
      case Node::For: exec_for(n); return;
      case Node::Set: {
        Value v = eval(*n.expr);
        if (n.set_obj) {
          Value o = eval(*n.set_obj);
          LT_CHECK(o.kind == Value::Object && o.is_namespace, "{}:{}: cannot set attribute '{}' of a non-namespace",
                   origin_, n.line, n.attr);
          // A namespace outlives loop iterations: values nested in it could grow without end, or hold it.
          LT_CHECK(value_depth(v, o.dict.get()) + 1 <= lim_.max_nesting,
                   "{}:{}: the value set to '{}' nests lists, dicts or namespaces deeper than {} levels, or holds "
                   "the namespace itself (max_nesting)",
                   origin_, n.line, n.attr, lim_.max_nesting);
          o.dict->set(n.attr, v);
        } else if (n.targets.size() == 1) {
          scopes_.back()->set(n.targets[0], v);
        } else {
          const List l = iterate(v);
          LT_CHECK(l.size() == n.targets.size(), "{}:{}: cannot unpack {} values into {}", origin_, n.line, l.size(),
                   n.targets.size());
          for (size_t k = 0; k < l.size(); ++k) scopes_.back()->set(n.targets[k], l[k]);
        }
        return;
      }
      case Node::SetBlock: {
        std::string saved;
        saved.swap(out);
        exec(n.body);
        saved.swap(out);
        scopes_.back()->set(n.targets[0], Value(saved));
        return;
      }
      case Node::Macro: define_macro(n); return;
      case Node::Break: throw BreakSignal{};
      case Node::Continue: throw ContinueSignal{};
      case Node::Generation: {
        const size_t b = out.size();
        exec(n.body);
        gen.emplace_back(b, out.size());
        return;
      }
      case Node::CallBlock: {
        std::string saved;
        saved.swap(out);
        exec(n.body);
        saved.swap(out);
        Args a;
        for (const auto& x : n.expr->items) a.pos.push_back(eval(*x));
        for (const auto& [k, x] : n.expr->kwargs) a.kw.emplace_back(k, eval(*x));
        append_output(str(apply_filter(n.expr->name, Value(saved), a, n.line)), n.line);
        return;
      }
    }
  }

  void exec_for(const Node& n) {
    const Value seq = eval(*n.expr);
    List items = iterate(seq);
    if (n.filter) {
      List kept;
      for (auto& it : items) {
        count_loop_iteration(n.line);
        auto scope = std::make_shared<Dict>();
        bind_targets(*scope, n, it);
        scopes_.push_back(scope);
        const bool ok = eval(*n.filter).truthy();
        scopes_.pop_back();
        if (ok) kept.push_back(it);
      }
      items.swap(kept);
    }
    if (items.empty()) {
      exec(n.else_body);
      return;
    }
    auto scope = std::make_shared<Dict>();
    scopes_.push_back(scope);
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      count_loop_iteration(n.line);
      scope->items.clear();
      bind_targets(*scope, n, items[k]);
      Value loop = Value::object();
      auto& d = loop.dict->items;  // distinct keys: appended directly (this runs once per iteration)
      d.reserve(10);
      d.emplace_back("index", Value(k + 1));
      d.emplace_back("index0", Value(k));
      d.emplace_back("revindex", Value(len - k));
      d.emplace_back("revindex0", Value(len - k - 1));
      d.emplace_back("first", Value(k == 0));
      d.emplace_back("last", Value(k == len - 1));
      d.emplace_back("length", Value(len));
      d.emplace_back("previtem", k > 0 ? items[k - 1] : Value());
      d.emplace_back("nextitem", k + 1 < len ? items[k + 1] : Value());
      d.emplace_back("cycle", Value::function([k](Args& a) { return a.pos.empty() ? Value() : a.pos[k % a.pos.size()]; }));
      scope->set("loop", loop);
      try {
        exec(n.body);
      } catch (const BreakSignal&) {
        break;
      } catch (const ContinueSignal&) {
        continue;
      }
    }
    scopes_.pop_back();
  }

  void bind_targets(Dict& scope, const Node& n, const Value& it) {
    if (n.targets.size() == 1) {
      scope.set(n.targets[0], it);
      return;
    }
    const List l = iterate(it);
    LT_CHECK(l.size() == n.targets.size(), "{}:{}: cannot unpack {} values into {} loop variables", origin_, n.line,
             l.size(), n.targets.size());
    for (size_t k = 0; k < l.size(); ++k) scope.set(n.targets[k], l[k]);
  }

  void define_macro(const Node& n) {
    const Node* node = &n;
    Value f = Value::function([this, node](Args& a) {
      const MacroCall call(*this, *node);
      auto scope = std::make_shared<Dict>();
      for (size_t k = 1; k < node->targets.size(); ++k) {
        const std::string& p = node->targets[k];
        Value v = a.get(k - 1, p.c_str());
        if (!v.defined() && node->defaults[k - 1]) v = eval(*node->defaults[k - 1]);
        scope->set(p, v);
      }
      std::vector<std::shared_ptr<Dict>> saved_scopes = {globals_.dict, scope};
      saved_scopes.swap(scopes_);
      std::string saved;
      saved.swap(out);
      try {
        exec(node->body);
      } catch (...) {
        saved.swap(out);
        saved_scopes.swap(scopes_);
        throw;
      }
      saved.swap(out);
      saved_scopes.swap(scopes_);
      return Value(saved);
    });
    scopes_.back()->set(n.targets[0], f);
  }

  // ---------------- expressions
  Value lookup(const std::string& name) const {
    for (size_t k = scopes_.size(); k-- > 0;)
      if (const Value* v = scopes_[k]->find(name)) return *v;
    return Value();
  }

  Value eval(const Expr& e) {
    const Level level(*this, e.line);
    switch (e.kind) {
      case Expr::Literal: return e.lit;
      case Expr::Name: return lookup(e.name);
      case Expr::ListLit: case Expr::TupleLit: {
        Value v = Value::array();
        for (const auto& x : e.items) v.list->push_back(eval(*x));
        return v;
      }
      case Expr::DictLit: {
        Value v = Value::object();
        for (size_t k = 0; k + 1 < e.items.size(); k += 2) v.dict->set(str(eval(*e.items[k])), eval(*e.items[k + 1]));
        return v;
      }
      case Expr::Attr: return get_attr(eval(*e.a), e.name);
      case Expr::Item: return get_item(eval(*e.a), eval(*e.b));
      case Expr::Slice: return slice(e);
      case Expr::Call: {
        Value f = eval(*e.a);
        Args a = args(e);
        LT_CHECK(f.kind == Value::Function, "{}:{}: '{}' is not callable", origin_, e.line,
                 e.a->kind == Expr::Name || e.a->kind == Expr::Attr ? e.a->name : repr(f));
        return (*f.fn)(a);
      }
      case Expr::Filter: {
        Args a = args(e);
        return apply_filter(e.name, eval(*e.a), a, e.line);
      }
      case Expr::Test: {
        Args a = args(e);
        const bool r = apply_test(e.name, eval(*e.a), a, e.line);
        return Value(e.negate ? !r : r);
      }
      case Expr::Unary: {
        const Value v = eval(*e.a);
        if (e.name == "not") return Value(!v.truthy());
        if (e.name == "-") return v.kind == Value::Float ? Value(-v.f) : Value(-to_int(v));
        return v;
      }
      case Expr::Binary: return binary(e);
      case Expr::Cond:
        if (eval(*e.b).truthy()) return eval(*e.a);
        return e.c ? eval(*e.c) : Value();
    }
    return Value();
  }

  Args args(const Expr& e) {
    Args a;
    for (const auto& x : e.items) a.pos.push_back(eval(*x));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
    return a;
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value l = eval(*e.a);
      return l.truthy() ? eval(*e.b) : l;
    }
    if (op == "or") {
      Value l = eval(*e.a);
      return l.truthy() ? l : eval(*e.b);
    }
    const Value l = eval(*e.a), r = eval(*e.b);
    if (op == "==") return Value(equal(l, r));
    if (op == "!=") return Value(!equal(l, r));
    if (op == "<") return Value(less(l, r));
    if (op == ">") return Value(less(r, l));
    if (op == "<=") return Value(!less(r, l));
    if (op == ">=") return Value(!less(l, r));
    if (op == "in" || op == "not in") {
      bool in = false;
      if (r.kind == Value::String) in = l.kind == Value::String && r.s.find(l.s) != std::string::npos;
      else if (r.kind == Value::Object) in = r.dict->find(str(l)) != nullptr;
      else if (r.kind == Value::Array)
        for (const auto& x : *r.list) in = in || equal(x, l);
      else if (r.defined() && !r.is_none()) fail("{}:{}: 'in' needs a string, list or dict, got {}", origin_, e.line, repr(r));
      return Value(op == "in" ? in : !in);
    }
    if (op == "~") {
      std::string a = str(l), b = str(r);
      check_string(a.size() + b.size(), e.line);
      return Value(a + b);
    }
    if (op == "+") {
      if (l.kind == Value::String && r.kind == Value::String) {
        check_string(l.s.size() + r.s.size(), e.line);
        return Value(l.s + r.s);
      }
      if (l.kind == Value::Array && r.kind == Value::Array) {
        LT_CHECK(l.list->size() + r.list->size() <= size_t(lim_.max_list_items),
                 "{}:{}: a list of {} items exceeds the limit of {} (max_list_items)", origin_, e.line,
                 l.list->size() + r.list->size(), lim_.max_list_items);
        Value v = Value::array(*l.list);
        v.list->insert(v.list->end(), r.list->begin(), r.list->end());
        return v;
      }
      check_num(l, r, op, e.line);
      if (l.kind == Value::Float || r.kind == Value::Float) return Value(l.num() + r.num());
      return Value(to_int(l) + to_int(r));
    }
    if (op == "*") {
      if (l.kind == Value::String && r.kind == Value::Int) {
        if (r.i > 0 && !l.s.empty())
          LT_CHECK(r.i <= lim_.max_string_bytes / int64_t(l.s.size()),
                   "{}:{}: a string of {} bytes repeated {} times exceeds the limit of {} bytes (max_string_bytes)",
                   origin_, e.line, l.s.size(), r.i, lim_.max_string_bytes);
        std::string s;
        for (int64_t k = 0; k < r.i; ++k) s += l.s;
        return Value(s);
      }
      check_num(l, r, op, e.line);
      if (l.kind == Value::Float || r.kind == Value::Float) return Value(l.num() * r.num());
      return Value(to_int(l) * to_int(r));
    }
    check_num(l, r, op, e.line);
    if (op == "-") {
      if (l.kind == Value::Float || r.kind == Value::Float) return Value(l.num() - r.num());
      return Value(to_int(l) - to_int(r));
    }
    if (op == "/") {
      LT_CHECK(r.num() != 0, "{}:{}: division by zero", origin_, e.line);
      return Value(l.num() / r.num());
    }
    if (op == "//" || op == "%") {
      LT_CHECK(r.num() != 0, "{}:{}: division by zero", origin_, e.line);
      if (l.kind == Value::Float || r.kind == Value::Float) {
        const double q = std::floor(l.num() / r.num());
        return op == "//" ? Value(q) : Value(l.num() - q * r.num());
      }
      const int64_t a = to_int(l), b = to_int(r);
      LT_CHECK(!(a == std::numeric_limits<int64_t>::min() && b == -1), "{}:{}: integer overflow in {} {} {}", origin_,
               e.line, a, op, b);
      int64_t q = a / b;
      if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
      return op == "//" ? Value(q) : Value(a - q * b);
    }
    if (op == "**") {
      if (l.kind == Value::Int && r.kind == Value::Int && r.i >= 0) {
        const auto p = int_power(l.i, r.i);
        LT_CHECK(p.has_value(), "{}:{}: integer overflow in {} ** {}", origin_, e.line, l.i, r.i);
        return Value(*p);
      }
      return Value(std::pow(l.num(), r.num()));
    }
    fail("{}:{}: unknown operator '{}'", origin_, e.line, op);
  }

  void check_num(const Value& l, const Value& r, const std::string& op, int line) {
    auto ok = [](const Value& v) { return v.is_number() || v.kind == Value::Bool; };
    LT_CHECK(ok(l) && ok(r), "{}:{}: unsupported operand types for {}: {} and {}", origin_, line, op, repr(l), repr(r));
  }

  Value get_item(const Value& o, const Value& k) {
    if (o.kind == Value::Object) {
      const Value* v = o.dict->find(str(k));
      return v ? *v : Value();
    }
    if (o.kind == Value::Array || o.kind == Value::String) {
      if (k.kind != Value::Int) return get_attr(o, str(k));
      const int64_t n = length(o);
      int64_t i = k.i < 0 ? k.i + n : k.i;
      if (i < 0 || i >= n) return Value();
      if (o.kind == Value::Array) return (*o.list)[static_cast<size_t>(i)];
      std::string s;
      utf8_append(s, u32(o.s)[static_cast<size_t>(i)]);
      return Value(s);
    }
    return Value();
  }

  Value slice(const Expr& e) {
    const Value o = eval(*e.a);
    const int64_t n = length(o);
    int64_t step = e.has_slice[2] ? to_int(eval(*e.items[2])) : 1;
    LT_CHECK(step != 0, "{}:{}: slice step cannot be zero", origin_, e.line);
    auto norm = [&](int64_t v, int64_t lo, int64_t hi) {
      if (v < 0) v += n;
      return std::clamp(v, lo, hi);
    };
    int64_t start, stop;
    if (step > 0) {
      start = e.has_slice[0] ? norm(to_int(eval(*e.items[0])), 0, n) : 0;
      stop = e.has_slice[1] ? norm(to_int(eval(*e.items[1])), 0, n) : n;
    } else {
      start = e.has_slice[0] ? norm(to_int(eval(*e.items[0])), -1, n - 1) : n - 1;
      stop = e.has_slice[1] ? norm(to_int(eval(*e.items[1])), -1, n - 1) : -1;
    }
    std::vector<int64_t> idx;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(i);
    if (o.kind == Value::String) {
      const std::u32string t = u32(o.s);
      std::u32string r;
      for (auto i : idx) r += t[static_cast<size_t>(i)];
      return Value(u8(r));
    }
    Value v = Value::array();
    if (o.kind == Value::Array)
      for (auto i : idx) v.list->push_back((*o.list)[static_cast<size_t>(i)]);
    return v;
  }

  Value method(const Value& o, const std::string& name) {
    const int64_t max_bytes = lim_.max_string_bytes;
    if (o.kind == Value::String) {
      const std::string s = o.s;
      if (name == "strip" || name == "lstrip" || name == "rstrip")
        return Value::function([s, name](Args& a) {
          return Value(strip_chars(s, a.get(0, "chars"), name != "rstrip", name != "lstrip"));
        });
      if (name == "split") return Value::function([s](Args& a) {
          const Value m = a.get(1, "maxsplit");
          return split(s, a.get(0, "sep"), m.kind == Value::Int ? m.i : -1);
        });
      if (name == "startswith" || name == "endswith")
        return Value::function([s, name](Args& a) {
          const Value p = a.get(0, "prefix");
          List cands = p.kind == Value::Array ? *p.list : List{p};
          for (const auto& c : cands) {
            if (c.kind != Value::String) continue;
            if (name == "startswith" ? s.compare(0, c.s.size(), c.s) == 0
                                     : (s.size() >= c.s.size() && s.compare(s.size() - c.s.size(), c.s.size(), c.s) == 0))
              return Value(true);
          }
          return Value(false);
        });
      if (name == "replace") return Value::function([s, max_bytes](Args& a) {
          const Value c = a.get(2, "count");
          return Value(replace_all(s, str(a.get(0, "old")), str(a.get(1, "new")), c.kind == Value::Int ? c.i : -1,
                                   max_bytes));
        });
      if (name == "upper") return Value::function([s](Args&) { return Value(case_map(s, 1)); });
      if (name == "lower") return Value::function([s](Args&) { return Value(case_map(s, 0)); });
      if (name == "title") return Value::function([s](Args&) { return Value(case_map(s, 2)); });
      if (name == "capitalize") return Value::function([s](Args&) { return Value(case_map(case_map(s, 0), 3)); });
      if (name == "find" || name == "rfind" || name == "index" || name == "count")
        return Value::function([s, name](Args& a) {
          const std::string sub = str(a.get(0, "sub"));
          if (name == "count") {
            if (sub.empty()) return Value(length(Value(s)) + 1);
            int64_t n = 0;
            for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
            return Value(n);
          }
          const size_t p = name == "rfind" ? s.rfind(sub) : s.find(sub);
          if (p == std::string::npos) {
            LT_CHECK(name != "index", "substring not found");
            return Value(int64_t{-1});
          }
          return Value(static_cast<int64_t>(u32(s.substr(0, p)).size()));
        });
      if (name == "join") return Value::function([s, max_bytes](Args& a) {
          return Value(join_items(iterate(a.get(0, "iterable")), s, max_bytes, [](const Value& x) { return str(x); }));
        });
      if (name == "splitlines") return Value::function([s](Args&) {
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
        });
      if (name == "removeprefix" || name == "removesuffix")
        return Value::function([s, name](Args& a) {
          const std::string x = str(a.get(0, "x"));
          if (name == "removeprefix") return Value(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
          return Value(s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0 ? s.substr(0, s.size() - x.size()) : s);
        });
      if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isupper" || name == "islower")
        return Value::function([s, name](Args&) {
          const std::u32string t = u32(s);
          if (t.empty()) return Value(false);
          for (char32_t c : t) {
            const bool ok = name == "isdigit" ? is_number(c) : name == "isspace" ? is_space_cp(c) : name == "isalpha" ? is_letter(c)
                          : name == "isupper" ? !(c >= 'a' && c <= 'z') : !(c >= 'A' && c <= 'Z');
            if (!ok) return Value(false);
          }
          return Value(true);
        });
      if (name == "format") return Value::function([s](Args& a) {
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
        });
    }
    if (o.kind == Value::Object && !o.is_namespace) {
      auto d = o.dict;
      if (name == "items") return Value::function([d](Args&) {
          Value v = Value::array();
          for (const auto& [k, x] : d->items) v.list->push_back(Value::array({Value(k), x}));
          return v;
        });
      if (name == "keys") return Value::function([d](Args&) {
          Value v = Value::array();
          for (const auto& kv : d->items) v.list->push_back(Value(kv.first));
          return v;
        });
      if (name == "values") return Value::function([d](Args&) {
          Value v = Value::array();
          for (const auto& kv : d->items) v.list->push_back(kv.second);
          return v;
        });
      if (name == "get") return Value::function([d](Args& a) {
          const Value* v = d->find(str(a.get(0, "key")));
          return v ? *v : a.get(1, "default", Value::none());
        });
    }
    return Value();
  }

  Value get_attr(const Value& o, const std::string& name) {
    Value m = method(o, name);
    if (m.defined()) return m;
    if (o.kind == Value::Object) {
      const Value* v = o.dict->find(name);
      return v ? *v : Value();
    }
    return Value();
  }

  // ---------------- filters and tests
  Value apply_filter(const std::string& f, const Value& v, Args& a, int line) {
    if (f == "length" || f == "count") return Value(length(v));
    if (f == "trim") return Value(strip_chars(str(v), a.get(0, "chars"), true, true));
    if (f == "upper") return Value(case_map(str(v), 1));
    if (f == "lower") return Value(case_map(str(v), 0));
    if (f == "title") return Value(case_map(str(v), 2));
    if (f == "capitalize") return Value(case_map(case_map(str(v), 0), 3));
    if (f == "string") return Value(str(v));
    if (f == "safe" || f == "e" || f == "escape" || f == "forceescape") return v;
    if (f == "int") return Value(to_int(v));
    if (f == "float") return Value(v.kind == Value::String ? std::atof(v.s.c_str()) : v.num());
    if (f == "abs") return v.kind == Value::Float ? Value(std::fabs(v.f)) : Value(static_cast<int64_t>(std::llabs(to_int(v))));
    if (f == "default" || f == "d") {
      const bool boolean = a.get(1, "boolean", Value(false)).truthy();
      if (!v.defined() || (boolean && !v.truthy())) return a.get(0, "default_value", Value(""));
      return v;
    }
    if (f == "first") { List l = iterate(v); return l.empty() ? Value() : l.front(); }
    if (f == "last") { List l = iterate(v); return l.empty() ? Value() : l.back(); }
    if (f == "list") return Value::array(iterate(v));
    if (f == "reverse") {
      if (v.kind == Value::String) { std::u32string t = u32(v.s); std::reverse(t.begin(), t.end()); return Value(u8(t)); }
      List l = iterate(v);
      std::reverse(l.begin(), l.end());
      return Value::array(l);
    }
    if (f == "join") {
      const std::string sep = str(a.get(0, "d", Value("")));
      const Value attr = a.get(1, "attribute");
      return Value(join_items(iterate(v), sep, lim_.max_string_bytes,
                              [&](const Value& x) { return str(attr.defined() ? get_attr(x, str(attr)) : x); }));
    }
    if (f == "replace") return Value(replace_all(str(v), str(a.get(0, "old")), str(a.get(1, "new")),
                                                 a.get(2, "count").kind == Value::Int ? a.get(2, "count").i : -1,
                                                 lim_.max_string_bytes));
    if (f == "tojson") {
      const Value ind = a.get(0, "indent");
      const int64_t indent = ind.kind == Value::Int ? std::max<int64_t>(ind.i, -1) : -1;
      LT_CHECK(indent <= lim_.max_string_bytes, "{}:{}: tojson indent {}: expected at most {} (max_string_bytes)",
               origin_, line, indent, lim_.max_string_bytes);
      return Value(to_json(v, static_cast<int>(indent), a.get(3, "sort_keys").truthy(),
                           static_cast<size_t>(lim_.max_string_bytes)));
    }
    if (f == "items") return method(v, "items").defined() ? (*method(v, "items").fn)(a) : Value::array();
    if (f == "dictsort") {
      const Value items_of = method(v, "items");
      LT_CHECK(items_of.defined(), "{}:{}: dictsort needs a dict, got {}", origin_, line, repr(v));
      Value items = (*items_of.fn)(a);
      std::sort(items.list->begin(), items.list->end(), [](const Value& x, const Value& y) { return less((*x.list)[0], (*y.list)[0]); });
      return items;
    }
    if (f == "sort") {
      List l = iterate(v);
      const Value attr = a.get(2, "attribute");
      const bool rev = a.get(0, "reverse").truthy();
      std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
        const Value xx = attr.defined() ? get_attr(x, str(attr)) : x, yy = attr.defined() ? get_attr(y, str(attr)) : y;
        return rev ? less(yy, xx) : less(xx, yy);
      });
      return Value::array(l);
    }
    if (f == "unique") {
      List out;
      for (const auto& x : iterate(v)) {
        bool seen = false;
        for (const auto& y : out) seen = seen || equal(x, y);
        if (!seen) out.push_back(x);
      }
      return Value::array(out);
    }
    if (f == "sum") {
      Value acc(int64_t{0});
      for (const auto& x : iterate(v)) acc = (acc.kind == Value::Float || x.kind == Value::Float) ? Value(acc.num() + x.num()) : Value(acc.i + to_int(x));
      return acc;
    }
    if (f == "min" || f == "max") {
      List l = iterate(v);
      if (l.empty()) return Value();
      Value best = l[0];
      for (const auto& x : l) if (f == "min" ? less(x, best) : less(best, x)) best = x;
      return best;
    }
    if (f == "round") {
      const int64_t prec = to_int(a.get(0, "precision", Value(int64_t{0})));
      const double m = std::pow(10.0, static_cast<double>(prec));
      return Value(std::round(v.num() * m) / m);
    }
    if (f == "indent") {
      const Value w = a.get(0, "width", Value(int64_t{4}));
      const int64_t width = w.kind == Value::String ? 0 : std::max<int64_t>(to_int(w), 0);  // Python: ' ' * -1 == ''
      LT_CHECK(width <= lim_.max_string_bytes, "{}:{}: indent width {}: expected at most {} (max_string_bytes)", origin_,
               line, width, lim_.max_string_bytes);
      const std::string pad = w.kind == Value::String ? w.s : std::string(static_cast<size_t>(width), ' ');
      const bool first = a.get(1, "first").truthy(), blank = a.get(2, "blank").truthy();
      const std::string s = str(v);
      std::string r;
      size_t prev = 0;
      bool is_first = true;
      for (;;) {
        const size_t p = s.find('\n', prev);
        const std::string line = s.substr(prev, p == std::string::npos ? std::string::npos : p - prev);
        if ((!is_first || first) && (blank || !line.empty())) r += pad;
        r += line;
        check_string_size(r.size(), lim_.max_string_bytes);
        if (p == std::string::npos) break;
        r += '\n';
        prev = p + 1;
        is_first = false;
      }
      return Value(r);
    }
    if (f == "wordcount") return Value(static_cast<int64_t>(split(str(v), Value(), -1).list->size()));
    if (f == "map") {
      const Value attr = a.get(99, "attribute");
      Value out = Value::array();
      for (const auto& x : iterate(v)) {
        if (attr.defined()) {
          Value r = get_attr(x, str(attr));
          if (!r.defined()) r = a.get(99, "default");
          out.list->push_back(r);
        } else {
          Args rest;
          rest.pos.assign(a.pos.begin() + std::min<size_t>(1, a.pos.size()), a.pos.end());
          out.list->push_back(apply_filter(str(a.get(0, "filter")), x, rest, line));
        }
      }
      return out;
    }
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
      const bool attr = f.size() > 6;
      const bool want = f[0] == 's';
      const size_t base = attr ? 1 : 0;
      Value out = Value::array();
      for (const auto& x : iterate(v)) {
        const Value subj = attr ? get_attr(x, str(a.get(0, "attribute"))) : x;
        bool ok;
        if (a.pos.size() > base) {
          Args ta;
          ta.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(base) + 1, a.pos.end());
          ok = apply_test(str(a.pos[base]), subj, ta, line);
        } else {
          ok = subj.truthy();
        }
        if (ok == want) out.list->push_back(x);
      }
      return out;
    }
    if (f == "batch") {
      const int64_t n = to_int(a.get(0, "linecount"));
      Value out = Value::array();
      for (const auto& x : iterate(v)) {
        if (out.list->empty() || static_cast<int64_t>(out.list->back().list->size()) >= n) out.list->push_back(Value::array());
        out.list->back().list->push_back(x);
      }
      return out;
    }
    fail("{}:{}: unknown filter '{}'", origin_, line, f);
  }

  bool apply_test(const std::string& t, const Value& v, Args& a, int line) {
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
    if (t == "in") {
      const Value c = a.get(0, "seq");
      if (c.kind == Value::String) return v.kind == Value::String && c.s.find(v.s) != std::string::npos;
      for (const auto& x : iterate(c)) if (equal(x, v)) return true;
      return false;
    }
    if (t == "lower") return str(v) == case_map(str(v), 0);
    if (t == "upper") return str(v) == case_map(str(v), 1);
    fail("{}:{}: unknown test '{}'", origin_, line, t);
  }

  void install_globals() {
    auto& g = *globals_.dict;
    const std::string origin = origin_;
    g.set("raise_exception", Value::function([origin](Args& a) -> Value {
            fail("{}: the chat template refused the conversation: {}", origin, str(a.get(0, "message")));
          }));
    g.set("strftime_now", Value::function([](Args& a) {
            const std::time_t now = std::time(nullptr);
            std::tm tm{};
            localtime_r(&now, &tm);
            char buf[256];
            const size_t n = std::strftime(buf, sizeof buf, str(a.get(0, "format")).c_str(), &tm);
            return Value(std::string(buf, n));
          }));
    const int64_t max_range = lim_.max_range;
    g.set("range", Value::function([max_range](Args& a) {
            int64_t start = 0, stop, step = 1;
            if (a.pos.size() == 1) stop = to_int(a.pos[0]);
            else {
              start = to_int(a.get(0, "start"));
              stop = to_int(a.get(1, "stop"));
              if (a.pos.size() > 2) step = to_int(a.pos[2]);
            }
            LT_CHECK(step != 0, "range: step must not be zero");
            const __int128 n = range_size(start, stop, step);
            LT_CHECK(n <= max_range, "range({}, {}, {}) has {} elements, more than the limit of {} (max_range)", start,
                     stop, step, uint64_t(n), max_range);
            Value v = Value::array();
            for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) v.list->push_back(Value(i));
            return v;
          }));
    g.set("namespace", Value::function([](Args& a) {
            Value v = Value::object();
            v.is_namespace = true;
            if (!a.pos.empty() && a.pos[0].kind == Value::Object)
              for (const auto& kv : a.pos[0].dict->items) v.dict->set(kv.first, kv.second);
            for (const auto& [k, x] : a.kw) v.dict->set(k, x);
            return v;
          }));
    g.set("dict", Value::function([](Args& a) {
            Value v = Value::object();
            for (const auto& [k, x] : a.kw) v.dict->set(k, x);
            return v;
          }));
  }

  std::string origin_;
  const Limits& lim_;
  int64_t depth_ = 0, calls_ = 0, iterations_ = 0;  // render recursion, macro calls in progress, loop iterations
  Value globals_;
  std::vector<std::shared_ptr<Dict>> scopes_;
};

bool has_generation(const Body& b) {
  for (const auto& n : b) {
    if (n->kind == Node::Generation) return true;
    for (const auto& [c, body] : n->branches)
      if (has_generation(body)) return true;
    if (has_generation(n->body) || has_generation(n->else_body)) return true;
  }
  return false;
}

}  // namespace

Template::Template(const std::string& source, const std::string& origin, const Limits& limits)
    : source_(source),
      origin_(origin),
      limits_(limits),
      body_(std::make_shared<Body>(parse_template(source, origin, limits))) {
  has_gen_ = has_generation(*body_);
}

RenderResult Template::render(const Value& context) const {
  LT_CHECK(context.kind == Value::Object, "{}: the render context must be an object", origin_);
  Renderer r(origin_, limits_, context);
  try {
    r.run(*body_);
  } catch (const BreakSignal&) {
    fail("{}: break outside a loop", origin_);
  } catch (const ContinueSignal&) {
    fail("{}: continue outside a loop", origin_);
  } catch (const Error& e) {
    // Errors of the value helpers (comparisons, iteration, range, ...) do not know the template.
    if (std::string_view(e.what()).substr(0, origin_.size()) == origin_) throw;
    fail("{}: {}", origin_, e.what());
  } catch (const std::bad_alloc&) {
    fail("{}: rendering the chat template ran out of memory", origin_);
  } catch (const std::length_error& e) {
    fail("{}: rendering the chat template built a value too large to hold ({})", origin_, e.what());
  }
  return RenderResult{std::move(r.out), std::move(r.gen)};
}

}  // namespace lt::data::jinja
