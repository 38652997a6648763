// The Jinja interpreter: statements, expressions and the globals that real chat templates use, with Python
// semantics; the filters, tests and methods (str, dict) are in filters.cpp and methods.cpp.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>
#include <new>
#include <optional>
#include <stdexcept>
#include <string_view>

#include "core/error.h"
#include "data/jinja/builtins.h"
#include "data/jinja/template.h"
#include "data/unicode.h"

namespace lt::data::jinja {

namespace {

struct BreakSignal {};
struct ContinueSignal {};

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

  // ---------------- filters, tests and attributes (filters.cpp, methods.cpp)
  Value apply_filter(const std::string& f, const Value& v, Args& a, int line) {
    return jinja::apply_filter(f, v, a, CallSite{origin_, lim_, line});
  }
  bool apply_test(const std::string& t, const Value& v, Args& a, int line) {
    return jinja::apply_test(t, v, a, CallSite{origin_, lim_, line});
  }
  Value get_attr(const Value& o, const std::string& name) const {
    return jinja::get_attr(o, name, lim_.max_string_bytes);
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
