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

const std::string kDemo = lt::testing::repo_root().string() + "/configs/demo";

std::vector<int32_t> loss_ids(const Encoded& e) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < e.ids.size(); ++i)
    if (e.loss[i]) out.push_back(e.ids[i]);
  return out;
}

// {% generation %} blocks: the loss mask is exactly the tokens of the text the blocks produced (HF's
// return_assistant_tokens_mask), not the rule derived from renders.
TEST(ChatTemplate, GenerationBlocksGiveTheMask) {
  const LoadedTokenizer lt = load_tokenizer(kDemo);
  TokenizerConfig cfg = lt.config;
  // Only the content is in the block (the end-of-turn token is not): the derived rule would add it.
  cfg.chat_template =
      "{% for m in messages %}<|im_start|>{{ m.role }}\n"
      "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}"
      "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  const ChatTemplate t = ChatTemplate::resolve("auto", lt.tokenizer, cfg);
  const std::vector<Message> msgs = {{"user", "What is 12 + 7?"}, {"assistant", "2+7+0=9, 1+0+0=1. The answer is: 19"},
                                     {"user", "And 3 + 4?"}, {"assistant", "The answer is: 7"}};
  const Encoded e = t.encode(msgs);
  const ChatTemplate chatml = ChatTemplate::resolve("chatml", lt.tokenizer, cfg);
  const Encoded c = chatml.encode(msgs);
  EXPECT_EQ(e.ids, c.ids);  // same text as ChatML
  // The mask: exactly the tokens of each generation span, i.e. the two contents, nothing else.
  const jinja::RenderResult r = t.render(nlohmann::ordered_json::parse(
      R"([{"role":"user","content":"What is 12 + 7?"},{"role":"assistant","content":"2+7+0=9, 1+0+0=1. The answer is: 19"},)"
      R"({"role":"user","content":"And 3 + 4?"},{"role":"assistant","content":"The answer is: 7"}])"),
                                         false);
  ASSERT_EQ(r.generation.size(), 2u);
  std::vector<uint8_t> want;
  size_t pos = 0;
  for (auto [b, en] : r.generation) {
    const auto before = lt.tokenizer.encode(r.text.substr(pos, b - pos));
    const auto span = lt.tokenizer.encode(r.text.substr(b, en - b));
    want.insert(want.end(), before.size(), 0);
    want.insert(want.end(), span.size(), 1);
    pos = en;
  }
  want.insert(want.end(), lt.tokenizer.encode(r.text.substr(pos)).size(), 0);
  EXPECT_EQ(e.loss, want);
  EXPECT_EQ(lt.tokenizer.decode(loss_ids(e)), msgs[1].content + msgs[3].content);
  // The derived rule (ChatML fallback) also trains the end-of-turn token.
  EXPECT_EQ(lt.tokenizer.decode(loss_ids(c)), msgs[1].content + "<|im_end|>" + msgs[3].content + "<|im_end|>");
}

// template: chatml is the hand-written ChatML renderer: it needs no chat_template, and on the demo's
// ChatML template it gives the same ids and masks as executing that template (derived masks).
TEST(ChatTemplate, ChatmlFallback) {
  const LoadedTokenizer lt = load_tokenizer(kDemo);
  TokenizerConfig none = lt.config;
  none.chat_template.clear();
  EXPECT_THROW(ChatTemplate::resolve("auto", lt.tokenizer, none), lt::Error);
  const ChatTemplate fb = ChatTemplate::resolve("chatml", lt.tokenizer, none);
  EXPECT_EQ(fb.kind(), TemplateKind::ChatML);
  EXPECT_EQ(ChatTemplate::resolve("qwen", lt.tokenizer, none).kind(), TemplateKind::ChatML);
  const ChatTemplate own = ChatTemplate::resolve("auto", lt.tokenizer, lt.config);
  EXPECT_EQ(own.kind(), TemplateKind::Jinja);
  const std::vector<Message> msgs = {{"system", "Be brief."}, {"user", "What is 147 + 180?"},
                                     {"assistant", "7+0+0=7, 4+8+0=12, 1+1+1=3. The answer is: 327"}};
  const Encoded a = fb.encode(msgs), b = own.encode(msgs);
  EXPECT_EQ(lt.tokenizer.decode(a.ids),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 147 + 180?<|im_end|>\n"
            "<|im_start|>assistant\n7+0+0=7, 4+8+0=12, 1+1+1=3. The answer is: 327<|im_end|>\n");
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(fb.encode_prompt({msgs[0], msgs[1]}), own.encode_prompt({msgs[0], msgs[1]}));
  EXPECT_EQ(fb.stop_ids(), std::vector<int32_t>({*lt.tokenizer.token_to_id("<|im_end|>"),
                                                  *lt.tokenizer.token_to_id("<|endoftext|>")}));
}

// Message dicts keep their keys in insertion order, as Python dicts do in HF: tojson of a message and
// iteration over its items show role before content (nlohmann::json would sort them).
TEST(ChatTemplate, MessageKeysKeepInsertionOrder) {
  const LoadedTokenizer lt = load_tokenizer(kDemo);
  TokenizerConfig cfg = lt.config;
  cfg.chat_template =
      "{% for m in messages %}{{ m|tojson }}|{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}"
      "{% for k in m %}{{ k }},{% endfor %}\n{% endfor %}";  // trim_blocks eats that newline
  const ChatTemplate t = ChatTemplate::resolve("auto", lt.tokenizer, cfg);
  const auto msgs = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi", "name": "zed", "a": 1}])");
  EXPECT_EQ(t.render(msgs, false).text,
            "{\"role\": \"user\", \"content\": \"hi\", \"name\": \"zed\", \"a\": 1}|role=user;content=hi;name=zed;a=1;"
            "role,content,name,a,");
  // Messages of a data set (role, content) in the same order.
  const Encoded e = t.encode({{"user", "x"}}, true);
  EXPECT_EQ(lt.tokenizer.decode(e.ids), "{\"role\": \"user\", \"content\": \"x\"}|role=user;content=x;role,content,");
}

// Number literals out of range are template errors (fuzz_jinja found std::out_of_range escaping the
// lexer: fuzz/corpus/jinja/regress_int_overflow.jinja).
TEST(Jinja, NumberLiterals) {
  auto render = [](const std::string& src) { return jinja::Template(src, "t").render(jinja::Value::object()).text; };
  EXPECT_EQ(render("{{ 1_000 + 2.5e1 }}|{{ 7 // 2 }}|{{ 1e3 }}"), "1025.0|3|1000.0");
  EXPECT_THROW(render("{{ 99999999999999999999 }}"), lt::Error);
  EXPECT_THROW(render("{{ 1e999 }}"), lt::Error);
  EXPECT_THROW(render("{% set x = 1e %}"), lt::Error);
}

}  // namespace
