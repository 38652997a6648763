// Reproduces HF `tokenizers` encodings exactly (fixtures from tools/make_tokenizer_fixtures.py).
#include "../common/repo_path.h"
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "data/tokenizer.h"

using lt::data::Tokenizer;
using json = nlohmann::json;

namespace {
const std::string kDir = lt::testing::repo_root().string() + "/tests/fixtures/tokenizer/";

json load(const std::string& name) {
  std::ifstream f(kDir + name);
  return json::parse(f);
}

class Fixture : public ::testing::TestWithParam<std::string> {};

TEST_P(Fixture, PretokensMatchHf) {
  const Tokenizer tok = Tokenizer::from_file(kDir + GetParam() + "_tokenizer.json");
  const json cases = load(GetParam() + "_cases.json");
  for (const auto& c : cases["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tok.pre_tokenize(tok.normalize(text)), c["pretokens"].get<std::vector<std::string>>())
        << "text: " << text;
  }
}

TEST_P(Fixture, IdsMatchHf) {
  const Tokenizer tok = Tokenizer::from_file(kDir + GetParam() + "_tokenizer.json");
  const json cases = load(GetParam() + "_cases.json");
  ASSERT_GE(cases["cases"].size(), 20u);
  for (const auto& c : cases["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tok.encode(text), c["ids"].get<std::vector<int32_t>>()) << "text: " << text;
    EXPECT_EQ(tok.encode(text, /*add_special_tokens=*/true), c["ids_with_special"].get<std::vector<int32_t>>())
        << "text: " << text;
  }
}

TEST_P(Fixture, DecodeMatchesHf) {
  const Tokenizer tok = Tokenizer::from_file(kDir + GetParam() + "_tokenizer.json");
  const json cases = load(GetParam() + "_cases.json");
  for (const auto& c : cases["cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/true), c["decoded_skip_special"].get<std::string>());
  }
}

// Single code points in several contexts: pins the Unicode classes \s, \p{L}, \p{N} and case folding.
TEST_P(Fixture, UnicodeProbesMatchHf) {
  const Tokenizer tok = Tokenizer::from_file(kDir + GetParam() + "_tokenizer.json");
  const json cases = load(GetParam() + "_cases.json");
  ASSERT_GE(cases["probes"].size(), 300u);
  int bad = 0;
  for (const auto& c : cases["probes"]) {
    const std::string text = c["text"];
    const auto got = tok.encode(text);
    if (got != c["ids"].get<std::vector<int32_t>>()) {
      ++bad;
      ADD_FAILURE() << "probe text: " << text;
    }
    if (bad > 5) break;
  }
}

// 400 random strings over an alphabet aimed at the regex's corner cases (whitespace mixes, contractions
// next to letters, digit runs, NFD input that NFC composes, inline special tokens).
TEST_P(Fixture, RandomStringsMatchHf) {
  const Tokenizer tok = Tokenizer::from_file(kDir + GetParam() + "_tokenizer.json");
  const json cases = load(GetParam() + "_cases.json");
  ASSERT_EQ(cases["random"].size(), 400u);
  int bad = 0;
  for (const auto& c : cases["random"]) {
    const std::string text = c[0];
    if (tok.encode(text) != c[1].get<std::vector<int32_t>>()) {
      ADD_FAILURE() << "text: " << json(text).dump();
      if (++bad > 5) break;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Fixture, ::testing::Values("qwen2", "llama3"));

}  // namespace
