#include <gtest/gtest.h>

#include "infer/answer.h"

using namespace lt::train;

TEST(ExactMatch, ExtractsAfterLastMarker) {
  EXPECT_EQ(*extract_answer("We add. The answer is: 85"), "85");
  EXPECT_EQ(*extract_answer("The answer is: 3\nThe answer is: 42  \nmore"), "42");
  EXPECT_EQ(*extract_answer("so the answer is 7"), "7");
  EXPECT_FALSE(extract_answer("85").has_value());
}

TEST(ExactMatch, NumericNormalisation) {
  for (const char* s : {"85", "85.0", "+85", "85.", "085", "85.000", " 85 ", "$85"})
    EXPECT_EQ(normalize_answer(s), "85") << s;
  EXPECT_EQ(normalize_answer("1,085"), "1085");
  EXPECT_EQ(normalize_answer("-0.50"), "-0.5");
  EXPECT_EQ(normalize_answer("-0"), "0");
  EXPECT_EQ(normalize_answer(".5"), "0.5");
  EXPECT_EQ(normalize_answer("1,08"), "1,08");  // not a thousands grouping: compared as text
  EXPECT_EQ(normalize_answer("\\frac{1}{2}."), "\\frac{1}{2}");
  EXPECT_NE(normalize_answer("85.5"), normalize_answer("85"));
  EXPECT_NE(normalize_answer("-85"), normalize_answer("85"));
}

TEST(ExactMatch, ScoresResponses) {
  EXPECT_TRUE(exact_match("12 + 73 = 85. The answer is: 85.0", "The answer is: 85"));
  EXPECT_TRUE(exact_match("The answer is: +85", "85"));
  EXPECT_FALSE(exact_match("The answer is: 86", "The answer is: 85"));
  EXPECT_FALSE(exact_match("85", "The answer is: 85"));  // no marker: no answer
}
