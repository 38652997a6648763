// Chat templates producing token ids and a per-token loss mask. `template: auto` (the default)
// executes the model's own Jinja chat template (chat_template.jinja or tokenizer_config.json's
// chat_template) with the interpreter of data/jinja; chatml | llama3 | none are hand-written
// fallbacks. Loss masks: {% generation %} blocks where the template has them, otherwise derived
// from renders of the conversation's prefixes (docs/data.md).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/jinja/template.h"
#include "data/tokenizer.h"

namespace lt::data {

enum class TemplateKind { ChatML, Llama3, None, Jinja };
const char* template_name(TemplateKind k);
// "chatml" (alias "qwen"), "llama3", "none"; anything else is an error naming the choices.
TemplateKind parse_template_name(const std::string& name);
// Recognises a Jinja chat_template by its markers (<|im_start|> -> ChatML, <|start_header_id|> ->
// Llama-3); an unrecognised one is an error naming the choices and `origin`.
TemplateKind detect_template(const std::string& jinja, const std::string& origin);

// The parts of tokenizer_config.json we use. Missing file -> all empty.
struct TokenizerConfig {
  std::string chat_template;
  // Where chat_template came from, as errors of the template name it: ".../chat_template.jinja" or
  // ".../tokenizer_config.json: chat_template" (empty: not from a file).
  std::string chat_template_origin;
  std::string eos_token, bos_token, pad_token, unk_token;
  std::string origin;  // tokenizer_config.json's path
};
// path of tokenizer_config.json; a chat_template.jinja beside it takes precedence (as in transformers).
TokenizerConfig load_tokenizer_config(const std::string& path);

// A tokenizer directory (tokenizer.json [+ tokenizer_config.json]) or a tokenizer.json file.
struct LoadedTokenizer {
  Tokenizer tokenizer;
  TokenizerConfig config;
};
LoadedTokenizer load_tokenizer(const std::string& dir_or_file);

struct Message {
  std::string role;  // system | user | assistant
  std::string content;
};

// ids and, per token, whether it carries loss (1) or not (0).
struct Encoded {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss;
};

class ChatTemplate {
 public:
  // Resolves the special tokens the template needs; error if the tokenizer lacks them.
  ChatTemplate(TemplateKind kind, const Tokenizer& tok, const TokenizerConfig& cfg = {});
  // The model's Jinja template (cfg.chat_template), executed.
  ChatTemplate(const std::string& jinja_source, const Tokenizer& tok, const TokenizerConfig& cfg);
  // name: auto | chatml | qwen | llama3 | none. auto executes cfg.chat_template (error if none).
  static ChatTemplate resolve(const std::string& name, const Tokenizer& tok, const TokenizerConfig& cfg);

  // A conversation. Loss on assistant turns (content + end-of-turn token) unless train_on_inputs,
  // in which case on every token. Roles other than system/user/assistant are errors.
  //  ChatML: <|im_start|>{role}\n{content}<|im_end|>\n ...
  //  Llama-3: <|begin_of_text|> then <|start_header_id|>{role}<|end_header_id|>\n\n{trim(content)}<|eot_id|> ...
  //  none:   user/system content + "\n"; assistant content + eos (if the tokenizer has one).
  Encoded encode(const std::vector<Message>& msgs, bool train_on_inputs = false) const;
  // The prompt for generation: the conversation (normally ending with a user turn) followed by the
  // assistant header (add_generation_prompt).
  std::vector<int32_t> encode_prompt(const std::vector<Message>& msgs) const;
  // Pretraining text: ids + eos, all tokens carry loss.
  Encoded encode_text(const std::string& text) const;

  // Jinja only: the rendered text of arbitrary messages (JSON objects, as HF passes them) with extra
  // template variables (e.g. enable_thinking, date_string).
  // Keys of the messages keep their order (ordered_json), as Python dicts do in HF.
  jinja::RenderResult render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  // Jinja: render, then encode as HF does (no special tokens added, special tokens in the text parsed).
  std::vector<int32_t> encode_rendered(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                       const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  // Tokens that end an assistant turn (generation stops on any of them).
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  int32_t eos_id() const { return eos_id_; }  // -1 when none
  int32_t pad_id() const { return pad_id_; }  // pad_token, else eos, else 0
  TemplateKind kind() const { return kind_; }
  const Tokenizer& tokenizer() const { return tok_; }

 private:
  // Appends the tokens of header+body encoded as one text piece (as HF renders and tokenizes it);
  // tokens of the header carry `head_loss`, tokens of the body carry `body_loss`.
  void append_piece(Encoded& e, const std::string& header, const std::string& body, bool body_loss,
                    bool head_loss = false) const;
  void append_id(Encoded& e, int32_t id, bool loss) const;
  void append_turn(Encoded& e, const Message& m, bool train_on_inputs) const;

  Encoded encode_jinja(const std::vector<Message>& msgs, bool train_on_inputs) const;

  TemplateKind kind_;
  std::shared_ptr<const jinja::Template> jinja_;
  TokenizerConfig cfg_;
  Tokenizer tok_;  // cheap to copy: the BPE tables are shared
  int32_t im_start_ = -1, im_end_ = -1;                      // ChatML
  int32_t bos_ = -1, start_hdr_ = -1, end_hdr_ = -1, eot_ = -1;  // Llama-3
  int32_t eos_id_ = -1, pad_id_ = 0;
  std::vector<int32_t> stop_ids_;
};

}  // namespace lt::data
