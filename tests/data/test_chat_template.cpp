#include "../common/repo_path.h"
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/chat_template.h"

using namespace lt::data;
using json = nlohmann::json;

namespace {
const std::string kDir = lt::testing::repo_root().string() + "/tests/fixtures/tokenizer/";

std::vector<Message> to_messages(const json& j) {
  std::vector<Message> m;
  for (const auto& x : j) m.push_back({x["role"], x["content"]});
  return m;
}

// The C++ templates give the same ids as HF's apply_chat_template with the real Jinja templates.
TEST(ChatTemplate, MatchesHfApplyChatTemplate) {
  for (std::string fam : {"qwen2", "llama3"}) {
    const Tokenizer tok = Tokenizer::from_file(kDir + fam + "_tokenizer.json");
    const TokenizerConfig cfg = load_tokenizer_config(kDir + fam + "_tokenizer_config.json");
    const ChatTemplate t = ChatTemplate::resolve("auto", tok, cfg);
    EXPECT_EQ(t.kind(), TemplateKind::Jinja);  // the model's own template, executed
    // The hand-written fallback gives the same ids, and the derived loss mask equals its mask.
    const ChatTemplate fb = ChatTemplate::resolve(fam == "qwen2" ? "chatml" : "llama3", tok, cfg);
    std::ifstream f(kDir + fam + "_cases.json");
    const json cases = json::parse(f);
    ASSERT_GE(cases["chats"].size(), 2u);
    for (const auto& c : cases["chats"]) {
      const Encoded e = t.encode(to_messages(c["messages"]));
      EXPECT_EQ(e.ids, c["ids"].get<std::vector<int32_t>>()) << fam << ": " << c["text"].get<std::string>();
      EXPECT_EQ(e.ids.size(), e.loss.size());
      const Encoded f = fb.encode(to_messages(c["messages"]));
      EXPECT_EQ(f.ids, e.ids) << fam;
      EXPECT_EQ(f.loss, e.loss) << fam << ": " << c["text"].get<std::string>();
      EXPECT_EQ(t.encode_prompt(to_messages(c["messages"])), fb.encode_prompt(to_messages(c["messages"]))) << fam;
    }
  }
}

// Loss only on assistant content + end-of-turn token; train_on_inputs puts loss everywhere.
TEST(ChatTemplate, LossMaskCoversAssistantTurnsOnly) {
  for (std::string fam : {"qwen2", "llama3"}) {
    const Tokenizer tok = Tokenizer::from_file(kDir + fam + "_tokenizer.json");
    const ChatTemplate t = ChatTemplate::resolve(fam == "qwen2" ? "chatml" : "llama3", tok, {});
    const std::vector<Message> msgs = {{"system", "Be brief."}, {"user", "What is 2 + 3?"},
                                       {"assistant", "5. The answer is: 5"}, {"user", "And 1+1?"},
                                       {"assistant", "2"}};
    const Encoded e = t.encode(msgs);
    std::vector<int32_t> loss_ids;
    for (size_t i = 0; i < e.ids.size(); ++i)
      if (e.loss[i]) loss_ids.push_back(e.ids[i]);
    const std::string end = fam == "qwen2" ? "<|im_end|>" : "<|eot_id|>";
    EXPECT_EQ(tok.decode(loss_ids), "5. The answer is: 5" + end + "2" + end) << fam;
    const Encoded all = t.encode(msgs, /*train_on_inputs=*/true);
    EXPECT_EQ(all.ids, e.ids);
    for (auto l : all.loss) EXPECT_EQ(l, 1);
    // The generation prompt is the training sequence up to the start of the assistant's content.
    const auto prompt = t.encode_prompt({msgs[0], msgs[1]});
    const Encoded full = t.encode({msgs[0], msgs[1], msgs[2]});
    ASSERT_LT(prompt.size(), full.ids.size());
    EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), full.ids.begin())) << fam;
    EXPECT_EQ(full.loss[prompt.size() - 1], 0);
    EXPECT_EQ(full.loss[prompt.size()], 1);
    EXPECT_EQ(t.stop_ids()[0], *tok.token_to_id(end));
  }
}

TEST(ChatTemplate, UnknownNamesAreErrorsListingChoices) {
  const Tokenizer tok = Tokenizer::from_file(kDir + "qwen2_tokenizer.json");
  try {
    ChatTemplate::resolve("vicuna", tok, {});
    FAIL() << "expected an error";
  } catch (const lt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("chatml"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("llama3"), std::string::npos) << e.what();
  }
  TokenizerConfig cfg;
  cfg.chat_template = "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor";  // unclosed tag
  cfg.origin = "x/tokenizer_config.json";
  try {
    ChatTemplate::resolve("auto", tok, cfg);
    FAIL() << "expected an error";
  } catch (const lt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("x/tokenizer_config.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ChatTemplate::resolve("auto", tok, {}), lt::Error);  // no chat_template at all
  // Llama-3 template on a tokenizer without Llama-3 tokens: names the missing token.
  try {
    ChatTemplate(TemplateKind::Llama3, tok);
    FAIL();
  } catch (const lt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("<|begin_of_text|>"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, NoneTemplateAndPretrainingText) {
  const Tokenizer tok = Tokenizer::from_file(kDir + "qwen2_tokenizer.json");
  const ChatTemplate t(TemplateKind::None, tok);
  const int32_t eot = *tok.token_to_id("<|endoftext|>");
  EXPECT_EQ(t.eos_id(), eot);
  const Encoded e = t.encode({{"user", "Hi"}, {"assistant", "Hello"}});
  EXPECT_EQ(tok.decode(e.ids), "Hi\nHello<|endoftext|>");
  const Encoded p = t.encode_text("plain text");
  EXPECT_EQ(p.ids.back(), eot);
  for (auto l : p.loss) EXPECT_EQ(l, 1);
}

TEST(ChatTemplate, RoleErrors) {
  const Tokenizer tok = Tokenizer::from_file(kDir + "qwen2_tokenizer.json");
  const ChatTemplate t(TemplateKind::ChatML, tok);
  EXPECT_THROW(t.encode({{"tool", "x"}}), lt::Error);
}

}  // namespace
