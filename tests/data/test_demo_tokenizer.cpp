// The demo model's tokenizer (configs/demo, from tools/make_demo_tokenizer.py) with the builtin data.
#include "../common/repo_path.h"
#include <gtest/gtest.h>

#include "data/prepare.h"
#include "data/synth_math.h"

using namespace lt::data;

namespace {
const std::string kDemo = lt::testing::repo_root().string() + "/configs/demo";

TEST(DemoTokenizer, LoadsAndMatchesHfTokens) {
  const LoadedTokenizer lt = load_tokenizer(kDemo);
  const Tokenizer& tok = lt.tokenizer;
  EXPECT_EQ(tok.vocab_size(), 306);
  EXPECT_EQ(lt.config.eos_token, "<|im_end|>");
  const ChatTemplate t = ChatTemplate::resolve("auto", tok, lt.config);
  EXPECT_EQ(t.kind(), TemplateKind::Jinja);
  EXPECT_EQ(t.eos_id(), *tok.token_to_id("<|im_end|>"));
  EXPECT_EQ(t.pad_id(), *tok.token_to_id("<|endoftext|>"));
  // Tokens HF tokenizers produced for this text (printed by tools/make_demo_tokenizer.py).
  const std::vector<std::string> want = {
      "<|im_start|>", "user", "Ċ", "What", "Ġis", "Ġ", "1", "4", "7", "Ġ+", "Ġ", "3", "8", "?", "<|im_end|>", "Ċ",
      "<|im_start|>", "assistant", "Ċ", "7", "+", "8", "+", "0", "=", "1", "5", ",", "Ġ", "4", "+", "3", "+", "1",
      "=", "8", ",", "Ġ", "1", "+", "0", "+", "0", "=", "1", ".", "ĠThe", "Ġanswer", "Ġis", ":", "Ġ", "1", "8",
      "5", "<|im_end|>", "Ċ"};
  const Encoded e = t.encode({{"user", "What is 147 + 38?"},
                              {"assistant", "7+8+0=15, 4+3+1=8, 1+0+0=1. The answer is: 185"}});
  std::vector<std::string> got;
  for (int32_t id : e.ids) got.push_back(tok.id_to_token(id));
  EXPECT_EQ(got, want);
}

// Sequence lengths of the whole builtin problem space: the demo's cutoff_len must cover them.
TEST(DemoTokenizer, BuiltinMathLengths) {
  const LoadedTokenizer lt = load_tokenizer(kDemo);
  const ChatTemplate t = ChatTemplate::resolve("auto", lt.tokenizer, lt.config);
  const SynthMath m;
  size_t max_len = 0, total = 0, n = 0;
  for (auto split : {MathSplit::Train, MathSplit::Test}) {
    for (const auto& p : m.problems(split, 0, 1)) {
      if ((p.a * 7 + p.b) % 5 != 0) continue;  // a fifth of the space keeps the test fast
      const Encoded e = t.encode(m.record(p).messages);
      max_len = std::max(max_len, e.ids.size());
      total += e.ids.size();
      ++n;
      EXPECT_EQ(lt.tokenizer.decode(e.ids, true),
                "user\n" + m.query(p) + "\nassistant\n" + m.response(p) + "\n");
    }
  }
  RecordProperty("max_len", int(max_len));
  std::printf("builtin:math with configs/demo: %zu samples checked, mean %.1f tokens, max %zu\n", n,
              double(total) / double(n), max_len);
  EXPECT_LE(max_len, 64u);
}

TEST(DemoTokenizer, PrepareDataEndToEnd) {
  const LoadedTokenizer lt = load_tokenizer(kDemo);
  DataConfig c;
  c.dataset = "builtin:math";
  c.max_samples = 300;
  c.val_size = 0.1;
  c.cutoff_len = 64;
  const PreparedData d = prepare_data(c, lt);
  EXPECT_EQ(d.train.size(), 270u);
  EXPECT_EQ(d.val.size(), 30u);
  c.eval_dataset = "builtin:math-test";
  c.val_size = 40;
  const PreparedData d2 = prepare_data(c, lt);
  EXPECT_EQ(d2.train.size(), 300u);
  EXPECT_EQ(d2.val.size(), 40u);
}

}  // namespace
