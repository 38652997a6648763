#include "data/synth_math.h"

#include <algorithm>

#include "core/error.h"
#include "data/rng.h"

namespace lt::data {

SynthMath::SynthMath(SynthMathOptions opt) : opt_(std::move(opt)) {
  LT_CHECK(!opt_.ops.empty(), "builtin:math: ops: expected some of '+-*', got nothing");
  for (char c : opt_.ops) LT_CHECK(c == '+' || c == '-' || c == '*', "builtin:math: ops: unknown op '{}'; choices: + - *", c);
  LT_CHECK(opt_.max_operand >= 1 && opt_.max_operand <= 99999, "builtin:math: max: expected 1..99999, got {}", opt_.max_operand);
  LT_CHECK(opt_.style == "steps" || opt_.style == "direct", "builtin:math: style: expected steps or direct, got '{}'", opt_.style);
  LT_CHECK(opt_.test_percent >= 1 && opt_.test_percent <= 50, "builtin:math: test_percent: expected 1..50, got {}",
           opt_.test_percent);
  for (char op : opt_.ops) {
    for (int a = 0; a <= opt_.max_operand; ++a) {
      for (int b = 0; b <= opt_.max_operand; ++b) {
        if (op == '-' && a < b) continue;
        const MathProblem p{op, a, b};
        problems_[is_test(p) ? 1 : 0].push_back(p);
      }
    }
  }
  LT_CHECK(!problems_[0].empty() && !problems_[1].empty(), "builtin:math: a split is empty (max {} too small)",
           opt_.max_operand);
}

bool SynthMath::is_test(const MathProblem& p) const {
  const uint64_t key = (uint64_t(uint8_t(p.op)) << 40) | (uint64_t(p.a) << 20) | uint64_t(p.b);
  return splitmix64(key ^ 0x6C617A7974726169ull) % 100 < uint64_t(opt_.test_percent);
}

std::string SynthMath::query(const MathProblem& p) const {
  return fmt::format("What is {} {} {}?", p.a, p.op, p.b);
}

namespace {
std::vector<int> digits_lsb(int x) {
  std::vector<int> d;
  do {
    d.push_back(x % 10);
    x /= 10;
  } while (x > 0);
  return d;
}
}  // namespace

std::string SynthMath::response(const MathProblem& p) const {
  const std::string tail = fmt::format("The answer is: {}", p.result());
  if (opt_.style == "direct" || p.op == '*') return fmt::format("{} {} {} = {}. {}", p.a, p.op, p.b, p.result(), tail);
  // Column method, least significant digit first; every column written the same way so the
  // pattern is easy to learn: "da+db+carry=sum" (addition) or "da-db-borrow=diff" with da+10
  // written when a borrow is taken (subtraction).
  const auto da = digits_lsb(p.a), db = digits_lsb(p.b);
  const size_t n = std::max(da.size(), db.size());
  std::string s;
  int c = 0;
  for (size_t i = 0; i < n; ++i) {
    const int x = i < da.size() ? da[i] : 0, y = i < db.size() ? db[i] : 0;
    if (!s.empty()) s += ", ";
    if (p.op == '+') {
      const int sum = x + y + c;
      s += fmt::format("{}+{}+{}={}", x, y, c, sum);
      c = sum / 10;
    } else {
      int top = x;
      const int borrow_in = c;
      c = (x - y - borrow_in < 0) ? 1 : 0;
      top += 10 * c;
      s += fmt::format("{}-{}-{}={}", top, y, borrow_in, top - y - borrow_in);
    }
  }
  return s + ". " + tail;
}

std::vector<MathProblem> SynthMath::problems(MathSplit split, int64_t n, uint64_t seed) const {
  const auto& pool = problems_[int(split)];
  const int64_t size = static_cast<int64_t>(pool.size());
  if (n <= 0) n = size;
  std::vector<MathProblem> out;
  out.reserve(static_cast<size_t>(n));
  for (uint64_t round = 0; static_cast<int64_t>(out.size()) < n; ++round) {
    const auto perm = permutation(size, splitmix64(seed * 1315423911ull + round + (split == MathSplit::Test ? 77 : 0)));
    for (int64_t i = 0; i < size && static_cast<int64_t>(out.size()) < n; ++i) out.push_back(pool[perm[i]]);
  }
  return out;
}

Record SynthMath::record(const MathProblem& p) const {
  Record r;
  r.messages = {{"user", query(p)}, {"assistant", response(p)}};
  return r;
}

std::vector<Record> SynthMath::records(MathSplit s, int64_t n, uint64_t seed) const {
  std::vector<Record> out;
  for (const auto& p : problems(s, n, seed)) out.push_back(record(p));
  return out;
}

bool is_builtin_math(const std::string& spec) {
  return spec.rfind("builtin:math", 0) == 0;
}

std::vector<Record> builtin_math_records(const std::string& spec, int64_t n, uint64_t seed) {
  LT_CHECK(is_builtin_math(spec), "dataset: '{}' is not a builtin:math spec", spec);
  std::string name = spec, query;
  if (auto q = spec.find('?'); q != std::string::npos) {
    name = spec.substr(0, q);
    query = spec.substr(q + 1);
  }
  MathSplit split;
  if (name == "builtin:math" || name == "builtin:math-train") split = MathSplit::Train;
  else if (name == "builtin:math-test") split = MathSplit::Test;
  else fail("dataset: unknown builtin '{}'; choices: builtin:math, builtin:math-test", name);
  SynthMathOptions o;
  size_t pos = 0;
  while (pos < query.size()) {
    const size_t amp = std::min(query.find('&', pos), query.size());
    const std::string kv = query.substr(pos, amp - pos);
    pos = amp + 1;
    const auto eq = kv.find('=');
    LT_CHECK(eq != std::string::npos, "dataset '{}': expected key=value, got '{}'", spec, kv);
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    auto to_int = [&](const std::string& s) {
      try {
        size_t used = 0;
        const int x = std::stoi(s, &used);
        if (used == s.size()) return x;
      } catch (...) {
      }
      fail("dataset '{}': {}: expected an integer, got '{}'", spec, k, s);
    };
    if (k == "ops") o.ops = v;
    else if (k == "max") o.max_operand = to_int(v);
    else if (k == "style") o.style = v;
    else if (k == "test_percent") o.test_percent = to_int(v);
    else fail("dataset '{}': unknown option '{}'; choices: ops, max, style, test_percent", spec, k);
  }
  return SynthMath(o).records(split, n, seed);
}

}  // namespace lt::data
