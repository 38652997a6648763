#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "core/error.h"
#include "data/synth_math.h"

using namespace lt::data;

namespace {

TEST(SynthMath, SpaceAndDisjointHeldOutSplit) {
  const SynthMath m;
  EXPECT_GE(m.space_size(), 10000);
  EXPECT_EQ(m.space_size(), 200 * 200);
  const double test_share = double(m.split_size(MathSplit::Test)) / double(m.space_size());
  EXPECT_NEAR(test_share, 0.10, 0.01);
  const auto train = m.problems(MathSplit::Train, 0, 1);
  const auto test = m.problems(MathSplit::Test, 0, 1);
  EXPECT_EQ(int64_t(train.size() + test.size()), m.space_size());
  std::set<std::tuple<char, int, int>> tr;
  for (const auto& p : train) tr.insert({p.op, p.a, p.b});
  EXPECT_EQ(tr.size(), train.size());  // distinct
  for (const auto& p : test) {
    EXPECT_EQ(tr.count({p.op, p.a, p.b}), 0u);
    EXPECT_TRUE(m.is_test(p));
  }
  // More records than the split: still never a test problem.
  for (const auto& p : m.problems(MathSplit::Train, train.size() + 500, 3)) EXPECT_FALSE(m.is_test(p));
}

TEST(SynthMath, DeterministicBySeed) {
  const SynthMath m;
  const auto a = m.records(MathSplit::Train, 50, 9), b = m.records(MathSplit::Train, 50, 9),
             c = m.records(MathSplit::Train, 50, 10);
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].messages[0].content, b[i].messages[0].content);
    differs |= a[i].messages[0].content != c[i].messages[0].content;
  }
  EXPECT_TRUE(differs);
}

// Every column step of the worked solution is correct and the final answer is the result.
TEST(SynthMath, StepsAreArithmeticallyCorrect) {
  SynthMathOptions o;
  o.ops = "+-";
  const SynthMath m(o);
  EXPECT_GT(m.space_size(), 40000);
  const std::regex add(R"((\d+)\+(\d+)\+(\d)=(\d+))"), sub(R"((\d+)-(\d+)-(\d)=(\d+))");
  for (const auto& p : m.problems(MathSplit::Train, 3000, 4)) {
    const std::string q = m.query(p), r = m.response(p);
    EXPECT_EQ(q, fmt::format("What is {} {} {}?", p.a, p.op, p.b));
    const std::string tail = "The answer is: " + std::to_string(p.result());
    ASSERT_GE(r.size(), tail.size());
    EXPECT_EQ(r.substr(r.size() - tail.size()), tail) << r;
    // Rebuild the result from the steps.
    const std::regex& re = p.op == '+' ? add : sub;
    long value = 0, scale = 1, carry_out = 0;
    for (auto it = std::sregex_iterator(r.begin(), r.end(), re); it != std::sregex_iterator(); ++it) {
      const int x = std::stoi((*it)[1]), y = std::stoi((*it)[2]), c = std::stoi((*it)[3]), s = std::stoi((*it)[4]);
      EXPECT_EQ(c, carry_out) << r;
      if (p.op == '+') {
        EXPECT_EQ(x + y + c, s) << r;
        value += scale * (s % 10);
        carry_out = s / 10;
      } else {
        EXPECT_EQ(x - y - c, s) << r;
        EXPECT_GE(s, 0);
        value += scale * s;
        carry_out = x >= 10 ? 1 : 0;
      }
      scale *= 10;
    }
    if (p.op == '+') value += scale * carry_out;
    EXPECT_EQ(value, p.result()) << r;
  }
}

TEST(SynthMath, BuiltinSpecs) {
  const auto tr = builtin_math_records("builtin:math", 20, 1);
  const auto te = builtin_math_records("builtin:math-test", 20, 1);
  EXPECT_EQ(tr.size(), 20u);
  EXPECT_EQ(te.size(), 20u);
  const auto d = builtin_math_records("builtin:math?style=direct&max=99&ops=-", 5, 1);
  EXPECT_NE(d[0].reference().find(" = "), std::string::npos);
  EXPECT_NE(d[0].messages[0].content.find(" - "), std::string::npos);
  EXPECT_THROW(builtin_math_records("builtin:math?colour=red", 5, 1), lt::Error);
  EXPECT_THROW(builtin_math_records("builtin:math?max=x", 5, 1), lt::Error);
  EXPECT_THROW(builtin_math_records("builtin:math?ops=/", 5, 1), lt::Error);
}

}  // namespace
