// Tokenizer behaviour beyond the HF fixtures: error messages for malformed tokenizer.json, invalid
// UTF-8, decode round trips, BPE merge order.
#include "../common/repo_path.h"
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/unicode.h"

using namespace lt::data;
using json = nlohmann::json;

namespace {
const std::string kFile = lt::testing::repo_root().string() + "/tests/fixtures/tokenizer/qwen2_tokenizer.json";

json base() {
  std::ifstream f(kFile);
  return json::parse(f);
}

std::string error_of(const json& j) {
  try {
    Tokenizer::from_json(j, "t.json");
  } catch (const lt::Error& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerErrors, NameTheField) {
  json j = base();
  j.erase("model");
  EXPECT_NE(error_of(j).find("missing field 'model'"), std::string::npos) << error_of(j);
  j = base();
  j["model"]["vocab"]["Ġthe"] = "x";
  EXPECT_NE(error_of(j).find("model.vocab['Ġthe']"), std::string::npos) << error_of(j);
  j = base();
  j["model"]["merges"][3] = json::array({"zz_not_there", "a"});
  EXPECT_NE(error_of(j).find("model.merges[3]"), std::string::npos) << error_of(j);
  j = base();
  j["model"]["merges"][5] = 17;
  EXPECT_NE(error_of(j).find("model.merges[5]"), std::string::npos) << error_of(j);
  j = base();
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(error_of(j).find("unsupported model 'WordPiece'"), std::string::npos) << error_of(j);
  j = base();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_NE(error_of(j).find("pretokenizers[0].pattern: invalid regex"), std::string::npos) << error_of(j);
  j = base();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_NE(error_of(j).find("normalizer.type: unsupported normalizer 'BertNormalizer'"), std::string::npos) << error_of(j);
  j = base();
  j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "UnicodeScripts"}};
  EXPECT_NE(error_of(j).find("pretokenizers[0].type: unsupported pre-tokenizer 'UnicodeScripts'"), std::string::npos)
      << error_of(j);
  j = base();
  j["added_tokens"][1]["id"] = 2147483647;
  EXPECT_NE(error_of(j).find("added_tokens[1].id"), std::string::npos) << error_of(j);
  j = base();
  j["added_tokens"][0].erase("content");
  EXPECT_NE(error_of(j).find("added_tokens[0]: missing field 'content'"), std::string::npos) << error_of(j);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), lt::Error);
  EXPECT_NE(error_of(json::array()).find("top level"), std::string::npos);
}

TEST(Tokenizer, LegacyStringMergesAreAccepted) {
  json j = base();
  json legacy = json::array();
  for (const auto& m : j["model"]["merges"]) legacy.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  j["model"]["merges"] = legacy;
  const Tokenizer a = Tokenizer::from_json(j, "legacy");
  const Tokenizer b = Tokenizer::from_file(kFile);
  const std::string text = "What is 147 + 38? The answer is: 185. It's naïve.";
  EXPECT_EQ(a.encode(text), b.encode(text));
}

TEST(Tokenizer, InvalidUtf8BecomesReplacementChar) {
  const Tokenizer tok = Tokenizer::from_file(kFile);
  const std::string bad = std::string("ab\xff") + "c\xe2\x82";
  const auto ids = tok.encode(bad);
  EXPECT_EQ(tok.decode(ids), "ab\xEF\xBF\xBD" "c\xEF\xBF\xBD");
  EXPECT_TRUE(utf8_valid(tok.decode({ids.begin(), ids.begin() + 1})));
}

// Random strings over a mixed alphabet round-trip through encode/decode (NFC-stable alphabet).
TEST(Tokenizer, RandomRoundTrip) {
  const Tokenizer tok = Tokenizer::from_file(kFile);
  const std::vector<std::string> alphabet = {"a", "Z", " ", "  ", "\n", "\t", "1", "42", "'s", "'LL", "é", "ß",
                                             "大", "型", "😀", "👍🏽", "!", "?.", "\r\n", "<|im_end|>", "<think>",
                                             "\u00a0", "\u3000", "ー", "\u0301"};
  std::mt19937 rng(5);
  for (int it = 0; it < 200; ++it) {
    std::string s;
    const int n = rng() % 30;
    for (int k = 0; k < n; ++k) {
      const std::string& piece = alphabet[rng() % alphabet.size()];
      if (piece == "\u0301" && (s.empty() || s.back() == 'a' || s.back() == ' ')) continue;  // keep NFC-stable
      s += piece;
    }
    s = nfc(s);
    EXPECT_EQ(tok.decode(tok.encode(s)), s) << s;
  }
}

TEST(Tokenizer, SpecialTokensSplitAndSkip) {
  const Tokenizer tok = Tokenizer::from_file(kFile);
  const int32_t im_end = *tok.token_to_id("<|im_end|>");
  EXPECT_TRUE(tok.is_special(im_end));
  EXPECT_FALSE(tok.is_special(*tok.token_to_id("<think>")));
  const auto ids = tok.encode("x<|im_end|>y");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], im_end);
  EXPECT_EQ(tok.decode(ids, true), "xy");
  // parse_special=false treats the marker as text.
  const auto plain = tok.encode("x<|im_end|>y", false, /*parse_special=*/false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), im_end), 0);
  EXPECT_EQ(tok.decode(plain), "x<|im_end|>y");
}

TEST(Pretokenizer, Qwen2SplitsDigitsLlama3GroupsThree) {
  auto with_pattern = [](const char* re) {
    json j = base();
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = re;
    j["normalizer"] = nullptr;
    return Tokenizer::from_json(j, "t.json");
  };
  const Tokenizer qwen = with_pattern(
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");
  const Tokenizer llama = with_pattern(
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");
  EXPECT_EQ(qwen.pre_tokenize("12345"), (std::vector<std::string>{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(llama.pre_tokenize("12345"), (std::vector<std::string>{"123", "45"}));
  EXPECT_EQ(qwen.pre_tokenize("a  b\n\n c   "), (std::vector<std::string>{"a", " ", " b", "\n\n", " c", "   "}));
  EXPECT_EQ(qwen.pre_tokenize("I'M here"), (std::vector<std::string>{"I", "'M", " here"}));
}

}  // namespace

namespace {

// ignore_merges (Llama-3): a pre-token that is itself in the vocabulary is one token, whatever the
// merges would give. Expected ids from HF tokenizers 0.23 on the same JSON.
TEST(Tokenizer, IgnoreMergesMatchesHf) {
  json j = base();
  j["added_tokens"] = json::array();
  j["normalizer"] = nullptr;
  j["post_processor"] = nullptr;
  j["model"]["vocab"] = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}, {"Ġ", 6}, {"Ġa", 7}};
  j["model"]["merges"] = json::array({json::array({"b", "c"}), json::array({"a", "b"}), json::array({"Ġ", "a"})});
  for (bool ignore : {false, true}) {
    j["model"]["ignore_merges"] = ignore;
    const Tokenizer t = Tokenizer::from_json(j, "tiny");
    EXPECT_EQ(t.encode("abc abc ab"), ignore ? std::vector<int32_t>({5, 7, 4, 6, 3}) : std::vector<int32_t>({0, 4, 7, 4, 6, 3}));
    EXPECT_EQ(t.encode("abcabc"), std::vector<int32_t>({0, 4, 0, 4}));
    EXPECT_EQ(t.decode(t.encode("abc abc ab")), "abc abc ab");
  }
}

// Random structural corruption of a real tokenizer.json: loading either works or throws lt::Error
// (never another exception type, never a crash).
TEST(TokenizerErrors, RandomCorruptionGivesCleanErrors) {
  const json good = base();
  std::mt19937 rng(11);
  const std::vector<json> junk = {nullptr, 17, -3, "x", json::array(), json::object(), true, 1e30,
                                  json::array({1, 2}), json{{"type", "BPE"}}};
  // Paths of interest (JSON pointers).
  std::vector<std::string> paths = {"/model", "/model/vocab", "/model/merges", "/model/merges/0", "/model/merges/0/1",
                                    "/model/type", "/model/ignore_merges", "/model/dropout", "/model/byte_fallback",
                                    "/added_tokens", "/added_tokens/0", "/added_tokens/0/id", "/added_tokens/1/content",
                                    "/added_tokens/2/special", "/normalizer", "/normalizer/type", "/pre_tokenizer",
                                    "/pre_tokenizer/type", "/pre_tokenizer/pretokenizers",
                                    "/pre_tokenizer/pretokenizers/0", "/pre_tokenizer/pretokenizers/0/pattern",
                                    "/pre_tokenizer/pretokenizers/1/use_regex", "/decoder", "/decoder/type",
                                    "/post_processor", "/post_processor/type", "/model/vocab/a"};
  int errors = 0;
  for (int it = 0; it < 200; ++it) {
    json j = good;
    const int n_mut = 1 + rng() % 3;
    for (int m = 0; m < n_mut; ++m) {
      const json::json_pointer p(paths[rng() % paths.size()]);
      if (!j.contains(p)) continue;
      if (rng() % 4 == 0 && p != json::json_pointer("")) {
        j[p.parent_pointer()].is_object() ? (void)j[p.parent_pointer()].erase(p.back()) : (void)0;
      } else {
        j[p] = junk[rng() % junk.size()];
      }
    }
    try {
      const Tokenizer t = Tokenizer::from_json(j, "mutated.json");
      (void)t.decode(t.encode("Hello <|im_end|> 123 café"));
    } catch (const lt::Error& e) {
      ++errors;
      EXPECT_NE(std::string(e.what()).find("mutated.json"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(errors, 60);
}

}  // namespace

namespace {

// lstrip/rstrip and single_word added tokens; expected ids from HF tokenizers 0.23.3 (AddedToken
// "<mask>" lstrip+rstrip special, "[WORD]" single_word, both added to the Qwen2 fixture).
TEST(Tokenizer, AddedTokenStripAndSingleWordMatchHf) {
  json j = base();
  j["added_tokens"].push_back({{"id", 1104}, {"content", "<mask>"}, {"single_word", false}, {"lstrip", true},
                               {"rstrip", true}, {"normalized", false}, {"special", true}});
  j["added_tokens"].push_back({{"id", 1105}, {"content", "[WORD]"}, {"single_word", true}, {"lstrip", false},
                               {"rstrip", false}, {"normalized", false}, {"special", false}});
  const Tokenizer tok = Tokenizer::from_json(j, "strip");
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"a <mask> b", {64, 1104, 65}},
      {"a  <mask>  b", {64, 1104, 65}},
      {"<mask>x", {1104, 87}},
      {"x<mask>", {87, 1104}},
      {"\t<mask>\n", {1104}},
      {"a[WORD]b", {64, 58, 54, 46, 49, 35, 60, 65}},
      {"a [WORD] b", {64, 220, 1105, 277}},
      {"[WORD]", {1105}},
      {"\u00e9[WORD]", {319, 58, 54, 46, 49, 35, 60}},
      {"1[WORD]", {16, 58, 54, 46, 49, 35, 60}},
      {"_[WORD]", {62, 58, 54, 46, 49, 35, 60}},
      {" [WORD]!", {220, 1105, 0}},
  };
  for (const auto& [text, ids] : cases) EXPECT_EQ(tok.encode(text), ids) << json(text).dump();
}

}  // namespace
