#include "data/chat_template.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lt::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* template_name(TemplateKind k) {
  switch (k) {
    case TemplateKind::ChatML: return "chatml";
    case TemplateKind::Llama3: return "llama3";
    case TemplateKind::None: return "none";
  }
  return "?";
}

TemplateKind parse_template_name(const std::string& name) {
  if (name == "chatml" || name == "qwen" || name == "qwen2" || name == "qwen3") return TemplateKind::ChatML;
  if (name == "llama3" || name == "llama-3") return TemplateKind::Llama3;
  if (name == "none" || name == "empty") return TemplateKind::None;
  fail("template: unknown chat template '{}'; choices: auto, chatml (alias qwen), llama3, none", name);
}

TemplateKind detect_template(const std::string& jinja, const std::string& origin) {
  const bool chatml = jinja.find("<|im_start|>") != std::string::npos;
  const bool llama3 = jinja.find("<|start_header_id|>") != std::string::npos;
  if (chatml && !llama3) return TemplateKind::ChatML;
  if (llama3 && !chatml) return TemplateKind::Llama3;
  fail("{}: chat_template: not recognised as ChatML (<|im_start|>) or Llama-3 (<|start_header_id|>); "
       "set `template` to one of: chatml, llama3, none",
       origin.empty() ? "tokenizer_config.json" : origin);
}

namespace {
// A token field is a string or an AddedToken-like object {"content": ...}.
std::string token_field(const json& j, const char* name, const std::string& origin) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"];
  fail("{}: {}: expected a string or {{\"content\": ...}}, got {}", origin, name, it->dump());
}
}  // namespace

TokenizerConfig load_tokenizer_config(const std::string& path) {
  TokenizerConfig c;
  c.origin = path;
  std::ifstream f(path);
  if (!f.good()) return c;
  json j;
  try {
    j = json::parse(f);
  } catch (const json::parse_error& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
  LT_CHECK(j.is_object(), "{}: expected a JSON object", path);
  if (auto it = j.find("chat_template"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      c.chat_template = it->get<std::string>();
    } else if (it->is_array()) {  // [{"name": "default", "template": ...}, ...]
      for (const auto& e : *it) {
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template")) c.chat_template = e["template"];
      }
      LT_CHECK(!c.chat_template.empty(), "{}: chat_template: a list without a 'default' entry", path);
    } else {
      fail("{}: chat_template: expected a string, got {}", path, it->type_name());
    }
  }
  c.eos_token = token_field(j, "eos_token", path);
  c.bos_token = token_field(j, "bos_token", path);
  c.pad_token = token_field(j, "pad_token", path);
  return c;
}

LoadedTokenizer load_tokenizer(const std::string& dir_or_file) {
  fs::path p(dir_or_file);
  fs::path tj = p, tc;
  if (fs::is_directory(p)) {
    tj = p / "tokenizer.json";
    tc = p / "tokenizer_config.json";
  } else {
    tc = p.parent_path() / "tokenizer_config.json";
  }
  LT_CHECK(fs::exists(tj), "tokenizer: '{}' not found (expected a tokenizer.json or a directory holding one)",
           tj.string());
  return LoadedTokenizer{Tokenizer::from_file(tj.string()), load_tokenizer_config(tc.string())};
}

ChatTemplate::ChatTemplate(TemplateKind kind, const Tokenizer& tok, const TokenizerConfig& cfg) : kind_(kind), tok_(tok) {
  auto need = [&](const char* t) {
    auto id = tok_.token_to_id(t);
    LT_CHECK(id.has_value(), "template {}: the tokenizer has no token '{}'", template_name(kind_), t);
    return *id;
  };
  auto opt = [&](const std::string& t) -> int32_t {
    if (t.empty()) return -1;
    auto id = tok_.token_to_id(t);
    LT_CHECK(id.has_value(), "{}: token '{}' is not in the tokenizer", cfg.origin.empty() ? "tokenizer_config" : cfg.origin, t);
    return *id;
  };
  eos_id_ = opt(cfg.eos_token);
  if (kind_ == TemplateKind::ChatML) {
    im_start_ = need("<|im_start|>");
    im_end_ = need("<|im_end|>");
    if (eos_id_ < 0) eos_id_ = im_end_;
    stop_ids_ = {im_end_};
    if (auto e = tok_.token_to_id("<|endoftext|>")) stop_ids_.push_back(*e);
  } else if (kind_ == TemplateKind::Llama3) {
    bos_ = need("<|begin_of_text|>");
    start_hdr_ = need("<|start_header_id|>");
    end_hdr_ = need("<|end_header_id|>");
    eot_ = need("<|eot_id|>");
    if (eos_id_ < 0) eos_id_ = eot_;
    stop_ids_ = {eot_};
    if (auto e = tok_.token_to_id("<|end_of_text|>")) stop_ids_.push_back(*e);
  } else {
    if (eos_id_ < 0) {
      for (const char* t : {"<|endoftext|>", "<|end_of_text|>", "</s>"}) {
        if (auto e = tok_.token_to_id(t)) { eos_id_ = *e; break; }
      }
    }
    if (eos_id_ >= 0) stop_ids_ = {eos_id_};
  }
  if (eos_id_ >= 0 && std::find(stop_ids_.begin(), stop_ids_.end(), eos_id_) == stop_ids_.end())
    stop_ids_.push_back(eos_id_);
  const int32_t pad = opt(cfg.pad_token);
  pad_id_ = pad >= 0 ? pad : (eos_id_ >= 0 ? eos_id_ : 0);
}

ChatTemplate ChatTemplate::resolve(const std::string& name, const Tokenizer& tok, const TokenizerConfig& cfg) {
  if (name.empty() || name == "auto") {
    LT_CHECK(!cfg.chat_template.empty(),
             "template: 'auto' needs a chat_template in tokenizer_config.json ({}); set `template` to one of: "
             "chatml, llama3, none",
             cfg.origin.empty() ? "no tokenizer_config.json found" : cfg.origin);
    return ChatTemplate(detect_template(cfg.chat_template, cfg.origin), tok, cfg);
  }
  return ChatTemplate(parse_template_name(name), tok, cfg);
}

void ChatTemplate::append_id(Encoded& e, int32_t id, bool loss) const {
  e.ids.push_back(id);
  e.loss.push_back(loss ? 1 : 0);
}

void ChatTemplate::append_piece(Encoded& e, const std::string& header, const std::string& body, bool body_loss,
                                bool head_loss) const {
  const auto all = tok_.encode(header + body);
  size_t n_head = 0;
  if (!header.empty()) {
    // The header's own tokens are normally a prefix of the joint encoding; if a token straddles the
    // boundary, it counts as header (no loss).
    const auto head = tok_.encode(header);
    while (n_head < head.size() && n_head < all.size() && head[n_head] == all[n_head]) ++n_head;
  }
  for (size_t i = 0; i < all.size(); ++i) append_id(e, all[i], i >= n_head ? body_loss : head_loss);
}

namespace {
std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const auto b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}
}  // namespace

void ChatTemplate::append_turn(Encoded& e, const Message& m, bool train_on_inputs) const {
  LT_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant",
           "chat message: unknown role '{}'; expected system, user or assistant", m.role);
  const bool asst = m.role == "assistant";
  const bool loss = asst || train_on_inputs;
  switch (kind_) {
    case TemplateKind::ChatML:
      append_id(e, im_start_, train_on_inputs);
      append_piece(e, m.role + "\n", m.content, loss, train_on_inputs);
      append_id(e, im_end_, loss);
      append_piece(e, "", "\n", train_on_inputs);
      break;
    case TemplateKind::Llama3:
      append_id(e, start_hdr_, train_on_inputs);
      append_piece(e, "", m.role, train_on_inputs);
      append_id(e, end_hdr_, train_on_inputs);
      append_piece(e, "\n\n", trim(m.content), loss, train_on_inputs);
      append_id(e, eot_, loss);
      break;
    case TemplateKind::None:
      if (asst) {
        append_piece(e, "", m.content, loss);
        if (eos_id_ >= 0) append_id(e, eos_id_, loss);
      } else {
        append_piece(e, "", m.content + "\n", loss);
      }
      break;
  }
}

Encoded ChatTemplate::encode(const std::vector<Message>& msgs, bool train_on_inputs) const {
  Encoded e;
  if (kind_ == TemplateKind::Llama3) append_id(e, bos_, train_on_inputs);
  for (const auto& m : msgs) append_turn(e, m, train_on_inputs);
  return e;
}

std::vector<int32_t> ChatTemplate::encode_prompt(const std::vector<Message>& msgs) const {
  Encoded e = encode(msgs, false);
  switch (kind_) {
    case TemplateKind::ChatML:
      append_id(e, im_start_, false);
      append_piece(e, "", "assistant\n", false);
      break;
    case TemplateKind::Llama3:
      append_id(e, start_hdr_, false);
      append_piece(e, "", "assistant", false);
      append_id(e, end_hdr_, false);
      append_piece(e, "", "\n\n", false);
      break;
    case TemplateKind::None:
      break;
  }
  return e.ids;
}

Encoded ChatTemplate::encode_text(const std::string& text) const {
  Encoded e;
  append_piece(e, "", text, true);
  if (eos_id_ >= 0) append_id(e, eos_id_, true);
  return e;
}

}  // namespace lt::data
