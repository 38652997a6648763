// Lexer and recursive-descent parser for Jinja templates, with HF's environment settings:
// trim_blocks (the first newline after a block or comment tag is removed) and lstrip_blocks
// (spaces and tabs from the start of a line up to a block or comment tag are removed), plus the
// -/+ whitespace controls of tags.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <system_error>

#include "core/error.h"
#include "data/jinja/ast.h"

namespace lt::data::jinja {

namespace {

struct Tok {
  enum Kind { Name, Str, Int, Float, Op, End } kind;
  std::string s;
  int64_t i = 0;
  double f = 0;
};

// One tag or text chunk of the template.
struct Chunk {
  enum Kind { Text, Expr, Stmt } kind;
  std::string text;       // Text
  std::vector<Tok> toks;  // Expr / Stmt
  int line;
};

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& origin) : s_(src), origin_(origin) {}

  std::vector<Chunk> run() {
    std::vector<Chunk> out;
    size_t pos = 0;
    bool strip_next_ws = false, trim_next_nl = false;
    while (pos <= s_.size()) {
      size_t open = find_open(pos);
      std::string text = s_.substr(pos, (open == std::string::npos ? s_.size() : open) - pos);
      if (strip_next_ws) {
        size_t k = 0;
        while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k]))) ++k;
        text.erase(0, k);
      } else if (trim_next_nl && !text.empty() && text[0] == '\n') {
        text.erase(0, 1);
      } else if (trim_next_nl && text.size() >= 2 && text[0] == '\r' && text[1] == '\n') {
        text.erase(0, 2);
      }
      strip_next_ws = trim_next_nl = false;
      if (open == std::string::npos) {
        if (!text.empty()) out.push_back({Chunk::Text, text, {}, line_at(pos)});
        break;
      }
      const char kind = s_[open + 1];  // '{' '%' '#'
      size_t p = open + 2;
      const bool minus = p < s_.size() && s_[p] == '-';
      const bool plus = p < s_.size() && s_[p] == '+';
      if (minus || plus) ++p;
      if (minus) {
        while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
      } else if (kind != '{' && !plus) {  // lstrip_blocks
        size_t k = text.size();
        while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
        if (at_line_start(open - (text.size() - k))) text.erase(k);
      }
      if (!text.empty()) out.push_back({Chunk::Text, text, {}, line_at(pos)});
      if (kind == '#') {
        const size_t close = s_.find("#}", p);
        LT_CHECK(close != std::string::npos, "{}:{}: unclosed comment", origin_, line_at(open));
        const bool rminus = close > 0 && s_[close - 1] == '-';
        strip_next_ws = rminus;
        trim_next_nl = !rminus;
        pos = close + 2;
        continue;
      }
      const char* close_s = kind == '{' ? "}}" : "%}";
      std::vector<Tok> toks;
      size_t q = p;
      bool rminus = false;
      for (;;) {
        while (q < s_.size() && std::isspace(static_cast<unsigned char>(s_[q]))) ++q;
        LT_CHECK(q < s_.size(), "{}:{}: unclosed tag", origin_, line_at(open));
        if (s_[q] == '-' && s_.compare(q + 1, 2, close_s) == 0) { rminus = true; q += 3; break; }
        if (s_[q] == '+' && s_.compare(q + 1, 2, close_s) == 0) { q += 3; break; }
        if (s_.compare(q, 2, close_s) == 0) { q += 2; break; }
        toks.push_back(next_tok(q));
      }
      // {% raw %} ... {% endraw %}: the body is text.
      if (kind == '%' && toks.size() == 1 && toks[0].kind == Tok::Name && toks[0].s == "raw") {
        size_t e = s_.find("endraw", q);
        LT_CHECK(e != std::string::npos, "{}:{}: raw without endraw", origin_, line_at(open));
        size_t tag = s_.rfind("{%", e);
        std::string body = s_.substr(q, tag - q);
        if (tag + 2 < s_.size() && s_[tag + 2] == '-')
          while (!body.empty() && std::isspace(static_cast<unsigned char>(body.back()))) body.pop_back();
        if (!body.empty()) out.push_back({Chunk::Text, body, {}, line_at(q)});
        size_t close = s_.find("%}", e);
        LT_CHECK(close != std::string::npos, "{}: unclosed endraw", origin_);
        rminus = s_[close - 1] == '-';
        q = close + 2;
      } else {
        out.push_back({kind == '{' ? Chunk::Expr : Chunk::Stmt, "", std::move(toks), line_at(open)});
      }
      strip_next_ws = rminus;
      trim_next_nl = !rminus && kind == '%';
      pos = q;
    }
    return out;
  }

 private:
  bool at_line_start(size_t i) const { return i == 0 || s_[i - 1] == '\n'; }
  size_t find_open(size_t from) const {
    for (size_t i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1)) {
      if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }
  int line_at(size_t pos) const {
    int n = 1;
    for (size_t i = 0; i < pos && i < s_.size(); ++i) n += s_[i] == '\n';
    return n;
  }
  Tok next_tok(size_t& q) {
    const char c = s_[q];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t b = q;
      while (q < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[q])) || s_[q] == '_')) ++q;
      return {Tok::Name, s_.substr(b, q - b)};
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t b = q;
      while (q < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[q])) || s_[q] == '_')) ++q;
      bool is_float = false;
      if (q + 1 < s_.size() && s_[q] == '.' && std::isdigit(static_cast<unsigned char>(s_[q + 1]))) {
        is_float = true;
        ++q;
        while (q < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q]))) ++q;
      }
      if (q < s_.size() && (s_[q] == 'e' || s_[q] == 'E')) {
        is_float = true;
        ++q;
        if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
        while (q < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q]))) ++q;
      }
      std::string num = s_.substr(b, q - b);
      num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
      Tok t{is_float ? Tok::Float : Tok::Int, num};
      // from_chars, not stod/stoll: an out-of-range literal is a template error, not an exception
      // escaping as std::out_of_range (found by fuzz_jinja; fuzz/corpus/jinja/regress_int_overflow.jinja).
      const char* end = num.data() + num.size();
      const auto r = is_float ? std::from_chars(num.data(), end, t.f) : std::from_chars(num.data(), end, t.i);
      LT_CHECK(r.ec == std::errc() && r.ptr == end, "{}:{}: invalid number literal '{}'", origin_, line_at(b), num);
      return t;
    }
    if (c == '\'' || c == '"') {
      std::string v;
      ++q;
      while (q < s_.size() && s_[q] != c) {
        if (s_[q] == '\\' && q + 1 < s_.size()) {
          const char e = s_[++q];
          switch (e) {
            case 'n': v += '\n'; break;
            case 't': v += '\t'; break;
            case 'r': v += '\r'; break;
            case '\\': v += '\\'; break;
            case '\'': v += '\''; break;
            case '"': v += '"'; break;
            default: v += '\\'; v += e; break;
          }
          ++q;
        } else {
          v += s_[q++];
        }
      }
      LT_CHECK(q < s_.size(), "{}: unterminated string literal", origin_);
      ++q;
      return {Tok::Str, v};
    }
    static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "(", ")",
                                "[", "]", "{", "}", ",", ".", ":", "|", "=", nullptr};
    for (int k = 0; ops[k]; ++k) {
      const size_t n = std::strlen(ops[k]);
      if (s_.compare(q, n, ops[k]) == 0) {
        q += n;
        return {Tok::Op, ops[k]};
      }
    }
    fail("{}:{}: unexpected character '{}' in a tag", origin_, line_at(q), c);
  }

  const std::string& s_;
  const std::string& origin_;
};

class Parser {
 public:
  Parser(std::vector<Chunk> chunks, const std::string& origin, const Limits& limits)
      : ch_(std::move(chunks)), origin_(origin), lim_(limits) {}

  Body parse_all() {
    Body b = parse_body({});
    LT_CHECK(ci_ == ch_.size(), "{}:{}: unexpected '{}'", origin_, ch_[ci_].line, stmt_name(ch_[ci_]));
    return b;
  }

 private:
  static std::string stmt_name(const Chunk& c) { return c.toks.empty() ? "" : c.toks[0].s; }
  static bool is_closing_tag(const std::string& name) {
    return name.rfind("end", 0) == 0 || name == "elif" || name == "else";
  }

  // A block statement being parsed (if, for, macro, ...): its name and line, for the errors of a block
  // left open or closed by the wrong tag. Also bounds the nesting of blocks (Limits::max_nesting).
  class OpenBlock {
   public:
    OpenBlock(Parser& p, const std::string& name, int line) : p_(p) {
      LT_CHECK(int64_t(p.open_.size()) < p.lim_.max_nesting, "{}:{}: blocks nested deeper than {} levels (max_nesting)",
               p.origin_, line, p.lim_.max_nesting);
      p.open_.emplace_back(name, line);
    }
    ~OpenBlock() { p_.open_.pop_back(); }
    OpenBlock(const OpenBlock&) = delete;
    OpenBlock& operator=(const OpenBlock&) = delete;

   private:
    Parser& p_;
  };

  // A closing tag (endfor, else, ...) that does not close the innermost open block: the error names both.
  [[noreturn]] void fail_stray_closing_tag(const std::string& name, int line) const {
    if (open_.empty()) fail("{}:{}: {{% {} %}} without a matching opening tag", origin_, line, name);
    const auto& [open_name, open_line] = open_.back();
    fail("{}:{}: unexpected {{% {} %}}: the innermost open block is {{% {} %}} opened at line {} (closed by {{% end{} %}})",
         origin_, line, name, open_name, open_line, open_name);
  }
  // The end of the template inside a block: names the block and where it opened.
  [[noreturn]] void fail_unclosed_block(const std::string& end_tag) const {
    const auto& [open_name, open_line] = open_.back();
    fail("{}:{}: unclosed {{% {} %}} opened at line {}: no {{% {} %}} before the end of the template", origin_,
         open_line, open_name, open_line, end_tag);
  }

  // Parses nodes until a statement whose name is in `ends` (left unconsumed); `ends` ends with the
  // closing tag of the innermost open block.
  Body parse_body(const std::vector<std::string>& ends) {
    Body body;
    while (ci_ < ch_.size()) {
      Chunk& c = ch_[ci_];
      if (c.kind == Chunk::Text) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Text;
        n->text = c.text;
        body.push_back(std::move(n));
        ++ci_;
        continue;
      }
      begin(c);
      if (c.kind == Chunk::Expr) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Output;
        n->line = c.line;
        n->expr = expr();
        expect_end();
        body.push_back(std::move(n));
        ++ci_;
        continue;
      }
      const std::string name = stmt_name(c);
      for (const auto& e : ends)
        if (name == e) return body;
      LT_CHECK(!name.empty(), "{}:{}: empty statement", origin_, c.line);
      if (is_closing_tag(name)) fail_stray_closing_tag(name, c.line);
      body.push_back(statement(name));
    }
    if (!ends.empty()) fail_unclosed_block(ends.back());
    return body;
  }

  NodeP statement(const std::string& name) {
    auto n = std::make_unique<Node>();
    n->line = ch_[ci_].line;
    const OpenBlock open(*this, name, n->line);
    ++ti_;  // the statement name
    if (name == "if") {
      n->kind = Node::If;
      ExprP cond = expr();
      expect_end();
      ++ci_;
      for (;;) {
        Body b = parse_body({"elif", "else", "endif"});
        n->branches.emplace_back(std::move(cond), std::move(b));
        LT_CHECK(ci_ < ch_.size(), "{}:{}: if without endif", origin_, n->line);
        begin(ch_[ci_]);
        const std::string s = next().s;
        if (s == "elif") {
          cond = expr();
          expect_end();
          ++ci_;
        } else if (s == "else") {
          expect_end();
          ++ci_;
          Body e = parse_body({"endif"});
          n->branches.emplace_back(nullptr, std::move(e));
          begin(ch_[ci_]);
          next();
          expect_end();
          ++ci_;
          break;
        } else {
          expect_end();
          ++ci_;
          break;
        }
      }
    } else if (name == "for") {
      n->kind = Node::For;
      n->targets.push_back(name_tok());
      while (peek_op(",")) {
        ++ti_;
        n->targets.push_back(name_tok());
      }
      LT_CHECK(next().s == "in", "{}:{}: expected 'in' in for", origin_, n->line);
      n->expr = expr(/*no_cond=*/true);
      if (peek_name("if")) {
        ++ti_;
        n->filter = expr(true);
      }
      if (peek_name("recursive")) ++ti_;
      expect_end();
      ++ci_;
      n->body = parse_body({"else", "endfor"});
      begin(ch_[ci_]);
      if (next().s == "else") {
        expect_end();
        ++ci_;
        n->else_body = parse_body({"endfor"});
        begin(ch_[ci_]);
        next();
      }
      expect_end();
      ++ci_;
    } else if (name == "set") {
      std::string first = name_tok();
      if (peek_op(".")) {
        ++ti_;
        auto obj = std::make_unique<Expr>();
        obj->kind = Expr::Name;
        obj->name = first;
        n->set_obj = std::move(obj);
        n->attr = name_tok();
      } else {
        n->targets.push_back(first);
        while (peek_op(",")) {
          ++ti_;
          n->targets.push_back(name_tok());
        }
      }
      if (peek_op("=")) {
        ++ti_;
        n->kind = Node::Set;
        n->expr = expr();
        expect_end();
        ++ci_;
      } else {
        n->kind = Node::SetBlock;
        expect_end();
        ++ci_;
        n->body = parse_body({"endset"});
        begin(ch_[ci_]);
        next();
        expect_end();
        ++ci_;
      }
    } else if (name == "macro") {
      n->kind = Node::Macro;
      n->targets.push_back(name_tok());
      expect_op("(");
      while (!peek_op(")")) {
        n->targets.push_back(name_tok());
        if (peek_op("=")) {
          ++ti_;
          n->defaults.push_back(expr());
        } else {
          n->defaults.push_back(nullptr);
        }
        if (peek_op(",")) ++ti_;
      }
      ++ti_;
      expect_end();
      ++ci_;
      n->body = parse_body({"endmacro"});
      begin(ch_[ci_]);
      next();
      expect_end();
      ++ci_;
    } else if (name == "break" || name == "continue") {
      n->kind = name == "break" ? Node::Break : Node::Continue;
      expect_end();
      ++ci_;
    } else if (name == "generation") {
      n->kind = Node::Generation;
      expect_end();
      ++ci_;
      n->body = parse_body({"endgeneration"});
      begin(ch_[ci_]);
      next();
      expect_end();
      ++ci_;
    } else if (name == "filter") {  // {% filter name %}...{% endfilter %}: a call block on the filter
      n->kind = Node::CallBlock;
      auto f = std::make_unique<Expr>();
      f->kind = Expr::Filter;
      f->name = name_tok();
      if (peek_op("(")) call_args(*f);
      n->expr = std::move(f);
      expect_end();
      ++ci_;
      n->body = parse_body({"endfilter"});
      begin(ch_[ci_]);
      next();
      expect_end();
      ++ci_;
    } else {
      fail("{}:{}: unsupported statement '{}'; supported: if, for, set, macro, break, continue, generation, filter, raw",
           origin_, n->line, name);
    }
    return n;
  }

  // ---- expressions
  ExprP mk(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = ch_[ci_].line;
    return e;
  }
  // Sets e's depth from its operands (all attached) and bounds it: a chain such as 1+1+...+1 builds its
  // tree without recursing, but evaluating and freeing it recurse once per level.
  ExprP finish(ExprP e) {
    int d = 0;
    auto see = [&d](const ExprP& x) {
      if (x) d = std::max(d, x->depth);
    };
    see(e->a);
    see(e->b);
    see(e->c);
    for (const auto& x : e->items) see(x);
    for (const auto& kv : e->kwargs) see(kv.second);
    e->depth = d + 1;
    LT_CHECK(e->depth <= lim_.max_nesting, "{}:{}: expression nested deeper than {} levels (max_nesting)", origin_,
             e->line, lim_.max_nesting);
    return e;
  }
  // Bounds the parser's own recursion (parentheses, brackets, `not not ...`, `- - ...`).
  class Nested {
   public:
    explicit Nested(Parser& p) : p_(p) {
      LT_CHECK(++p.nested_ <= p.lim_.max_nesting, "{}:{}: expression nested deeper than {} levels (max_nesting)",
               p.origin_, p.ch_[p.ci_].line, p.lim_.max_nesting);
    }
    ~Nested() { --p_.nested_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    Parser& p_;
  };

  ExprP expr(bool no_cond = false) {
    const Nested nested(*this);
    ExprP e = or_expr();
    if (!no_cond && peek_name("if")) {
      ++ti_;
      auto c = mk(Expr::Cond);
      c->b = or_expr();  // condition
      c->a = std::move(e);
      if (peek_name("else")) {
        ++ti_;
        c->c = expr();
      }
      return finish(std::move(c));
    }
    return e;
  }
  ExprP binary(ExprP l, const std::string& op, ExprP r) {
    auto e = mk(Expr::Binary);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return finish(std::move(e));
  }
  ExprP or_expr() {
    ExprP e = and_expr();
    while (peek_name("or")) {
      ++ti_;
      e = binary(std::move(e), "or", and_expr());
    }
    return e;
  }
  ExprP and_expr() {
    ExprP e = not_expr();
    while (peek_name("and")) {
      ++ti_;
      e = binary(std::move(e), "and", not_expr());
    }
    return e;
  }
  ExprP not_expr() {
    if (peek_name("not")) {
      const Nested nested(*this);
      ++ti_;
      auto e = mk(Expr::Unary);
      e->name = "not";
      e->a = not_expr();
      return finish(std::move(e));
    }
    return compare();
  }
  ExprP compare() {
    ExprP e = concat();
    for (;;) {
      if (peek_op("==") || peek_op("!=") || peek_op("<") || peek_op(">") || peek_op("<=") || peek_op(">=")) {
        const std::string op = next().s;
        e = binary(std::move(e), op, concat());
      } else if (peek_name("in")) {
        ++ti_;
        e = binary(std::move(e), "in", concat());
      } else if (peek_name("not") && ti_ + 1 < t().size() && t()[ti_ + 1].kind == Tok::Name && t()[ti_ + 1].s == "in") {
        ti_ += 2;
        e = binary(std::move(e), "not in", concat());
      } else {
        return e;
      }
    }
  }
  ExprP concat() {
    ExprP e = add();
    while (peek_op("~")) {
      ++ti_;
      e = binary(std::move(e), "~", add());
    }
    return e;
  }
  ExprP add() {
    ExprP e = mul();
    while (peek_op("+") || peek_op("-")) {
      const std::string op = next().s;
      e = binary(std::move(e), op, mul());
    }
    return e;
  }
  ExprP mul() {
    ExprP e = pow();
    while (peek_op("*") || peek_op("/") || peek_op("//") || peek_op("%")) {
      const std::string op = next().s;
      e = binary(std::move(e), op, pow());
    }
    return e;
  }
  ExprP pow() {
    ExprP e = unary();
    while (peek_op("**")) {
      ++ti_;
      e = binary(std::move(e), "**", unary());
    }
    return e;
  }
  ExprP unary() {
    if (peek_op("-") || peek_op("+")) {
      const Nested nested(*this);
      const std::string op = next().s;
      auto e = mk(Expr::Unary);
      e->name = op;
      e->a = unary();
      return finish(std::move(e));
    }
    return filters(postfix(primary()));
  }
  ExprP filters(ExprP e) {
    for (;;) {
      if (peek_op("|")) {
        ++ti_;
        auto f = mk(Expr::Filter);
        f->name = name_tok();
        f->a = std::move(e);
        if (peek_op("(")) call_args(*f);
        e = finish(std::move(f));
      } else if (peek_name("is")) {
        ++ti_;
        auto te = mk(Expr::Test);
        if (peek_name("not")) {
          ++ti_;
          te->negate = true;
        }
        te->name = name_tok();
        te->a = std::move(e);
        if (peek_op("(")) {
          call_args(*te);
        } else if (ti_ < t().size() && (t()[ti_].kind == Tok::Str || t()[ti_].kind == Tok::Int ||
                                        t()[ti_].kind == Tok::Float ||
                                        (t()[ti_].kind == Tok::Name && !is_keyword(t()[ti_].s)))) {
          te->items.push_back(postfix(primary()));
        }
        e = finish(std::move(te));
      } else {
        return e;
      }
    }
  }
  static bool is_keyword(const std::string& s) {
    return s == "and" || s == "or" || s == "not" || s == "in" || s == "is" || s == "if" || s == "else";
  }
  void call_args(Expr& e) {
    expect_op("(");
    while (!peek_op(")")) {
      if (ti_ + 1 < t().size() && t()[ti_].kind == Tok::Name && t()[ti_ + 1].kind == Tok::Op && t()[ti_ + 1].s == "=") {
        std::string k = next().s;
        ++ti_;
        e.kwargs.emplace_back(k, expr());
      } else {
        e.items.push_back(expr());
      }
      if (peek_op(",")) ++ti_;
      else LT_CHECK(peek_op(")"), "{}:{}: expected ',' or ')' in arguments", origin_, ch_[ci_].line);
    }
    ++ti_;
  }
  ExprP postfix(ExprP e) {
    for (;;) {
      if (peek_op(".")) {
        ++ti_;
        auto a = mk(Expr::Attr);
        a->a = std::move(e);
        const Tok& nt = next();
        a->name = nt.kind == Tok::Int ? std::to_string(nt.i) : nt.s;
        e = finish(std::move(a));
      } else if (peek_op("[")) {
        ++ti_;
        ExprP parts[3];
        bool has[3] = {false, false, false};
        int k = 0;
        bool slice = false;
        for (;;) {
          if (peek_op("]")) break;
          if (peek_op(":")) {
            ++ti_;
            slice = true;
            ++k;
            LT_CHECK(k < 3, "{}:{}: bad slice", origin_, ch_[ci_].line);
            continue;
          }
          parts[k] = expr();
          has[k] = true;
        }
        ++ti_;
        if (slice) {
          auto s = mk(Expr::Slice);
          s->a = std::move(e);
          s->items.push_back(std::move(parts[0]));
          s->items.push_back(std::move(parts[1]));
          s->items.push_back(std::move(parts[2]));
          for (int q = 0; q < 3; ++q) s->has_slice[q] = has[q];
          e = finish(std::move(s));
        } else {
          auto it = mk(Expr::Item);
          it->a = std::move(e);
          it->b = std::move(parts[0]);
          e = finish(std::move(it));
        }
      } else if (peek_op("(")) {
        auto c = mk(Expr::Call);
        c->a = std::move(e);
        call_args(*c);
        e = finish(std::move(c));
      } else {
        return e;
      }
    }
  }
  ExprP primary() {
    LT_CHECK(ti_ < t().size(), "{}:{}: unexpected end of expression", origin_, ch_[ci_].line);
    const Tok tk = next();
    auto lit = [&](Value v) {
      auto e = mk(Expr::Literal);
      e->lit = std::move(v);
      return e;
    };
    switch (tk.kind) {
      case Tok::Str: {
        std::string s = tk.s;
        while (ti_ < t().size() && t()[ti_].kind == Tok::Str) s += next().s;  // adjacent literals concatenate
        return lit(Value(s));
      }
      case Tok::Int: return lit(Value(tk.i));
      case Tok::Float: return lit(Value(tk.f));
      case Tok::Name:
        if (tk.s == "true" || tk.s == "True") return lit(Value(true));
        if (tk.s == "false" || tk.s == "False") return lit(Value(false));
        if (tk.s == "none" || tk.s == "None") return lit(Value::none());
        {
          auto e = mk(Expr::Name);
          e->name = tk.s;
          return e;
        }
      case Tok::Op:
        if (tk.s == "(") {
          if (peek_op(")")) {
            ++ti_;
            return mk(Expr::TupleLit);
          }
          ExprP e = expr();
          if (peek_op(",")) {
            auto tu = mk(Expr::TupleLit);
            tu->items.push_back(std::move(e));
            while (peek_op(",")) {
              ++ti_;
              if (peek_op(")")) break;
              tu->items.push_back(expr());
            }
            e = finish(std::move(tu));
          }
          expect_op(")");
          return e;
        }
        if (tk.s == "[") {
          auto l = mk(Expr::ListLit);
          while (!peek_op("]")) {
            l->items.push_back(expr());
            if (peek_op(",")) ++ti_;
          }
          ++ti_;
          return finish(std::move(l));
        }
        if (tk.s == "{") {
          auto d = mk(Expr::DictLit);
          while (!peek_op("}")) {
            d->items.push_back(expr());
            expect_op(":");
            d->items.push_back(expr());
            if (peek_op(",")) ++ti_;
          }
          ++ti_;
          return finish(std::move(d));
        }
        break;
      default: break;
    }
    fail("{}:{}: unexpected '{}' in an expression", origin_, ch_[ci_].line, tk.s);
  }

  // ---- token helpers
  void begin(Chunk&) { ti_ = 0; }
  const std::vector<Tok>& t() const { return ch_[ci_].toks; }
  const Tok& next() {
    LT_CHECK(ti_ < t().size(), "{}:{}: unexpected end of tag", origin_, ch_[ci_].line);
    return t()[ti_++];
  }
  bool peek_op(const char* s) const { return ti_ < t().size() && t()[ti_].kind == Tok::Op && t()[ti_].s == s; }
  bool peek_name(const char* s) const { return ti_ < t().size() && t()[ti_].kind == Tok::Name && t()[ti_].s == s; }
  std::string name_tok() {
    const Tok& tk = next();
    LT_CHECK(tk.kind == Tok::Name, "{}:{}: expected a name, got '{}'", origin_, ch_[ci_].line, tk.s);
    return tk.s;
  }
  void expect_op(const char* s) {
    LT_CHECK(peek_op(s), "{}:{}: expected '{}'", origin_, ch_[ci_].line, s);
    ++ti_;
  }
  void expect_end() {
    LT_CHECK(ti_ == t().size(), "{}:{}: unexpected '{}' at the end of a tag", origin_, ch_[ci_].line, t()[ti_].s);
  }

  std::vector<Chunk> ch_;
  size_t ci_ = 0, ti_ = 0;
  const std::string& origin_;
  const Limits& lim_;
  std::vector<std::pair<std::string, int>> open_;  // block statements being parsed: name, line
  int64_t nested_ = 0;                             // expression recursion depth
};

}  // namespace

Body parse_template(const std::string& src, const std::string& origin, const Limits& limits) {
  Lexer lx(src, origin);
  Parser p(lx.run(), origin, limits);
  return p.parse_all();
}

}  // namespace lt::data::jinja
