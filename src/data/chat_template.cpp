#include "data/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lt::data {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;  // messages: keys in insertion order, as Python dicts

const char* template_name(TemplateKind k) {
  switch (k) {
    case TemplateKind::ChatML: return "chatml";
    case TemplateKind::Llama3: return "llama3";
    case TemplateKind::None: return "none";
    case TemplateKind::Jinja: return "jinja";
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
  const fs::path jinja_file = fs::path(path).parent_path() / "chat_template.jinja";
  std::string jinja_src;
  if (std::ifstream jf(jinja_file, std::ios::binary); jf.good()) {
    std::stringstream ss;
    ss << jf.rdbuf();
    jinja_src = ss.str();
  }
  std::ifstream f(path);
  if (!f.good()) {
    c.chat_template = jinja_src;
    if (!jinja_src.empty()) c.origin = c.chat_template_origin = jinja_file.string();
    return c;
  }
  json j;
  try {
    j = json::parse(f);
  } catch (const json::parse_error& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
  LT_CHECK(j.is_object(), "{}: expected a JSON object", path);
  if (auto it = j.find("chat_template"); it != j.end() && !it->is_null()) {
    c.chat_template_origin = path + ": chat_template";
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
  c.unk_token = token_field(j, "unk_token", path);
  if (!jinja_src.empty()) {
    c.chat_template = jinja_src;
    c.chat_template_origin = jinja_file.string();
  }
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

ChatTemplate::ChatTemplate(TemplateKind kind, const Tokenizer& tok, const TokenizerConfig& cfg)
    : kind_(kind), cfg_(cfg), tok_(tok) {
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

namespace {
// What errors of a Jinja chat template name: the file it came from.
std::string template_origin(const TokenizerConfig& cfg) {
  if (!cfg.chat_template_origin.empty()) return cfg.chat_template_origin;
  return (cfg.origin.empty() ? std::string("tokenizer_config.json") : cfg.origin) + ": chat_template";
}
}  // namespace

ChatTemplate::ChatTemplate(const std::string& jinja_source, const Tokenizer& tok, const TokenizerConfig& cfg)
    : kind_(TemplateKind::Jinja),
      jinja_(std::make_shared<jinja::Template>(jinja_source, template_origin(cfg))),
      cfg_(cfg),
      tok_(tok) {
  auto opt = [&](const std::string& t) -> int32_t {
    if (t.empty()) return -1;
    auto id = tok_.token_to_id(t);
    LT_CHECK(id.has_value(), "{}: token '{}' is not in the tokenizer", cfg.origin.empty() ? "tokenizer_config" : cfg.origin, t);
    return *id;
  };
  eos_id_ = opt(cfg.eos_token);
  // End-of-turn tokens of the common families that the template text uses, then the eos.
  for (const char* t : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>",
                        "<|end_of_text|>", "</s>", "<｜end▁of▁sentence｜>", "<turn|>"}) {
    if (jinja_source.find(t) == std::string::npos && cfg.eos_token != t) continue;
    if (auto id = tok_.token_to_id(t)) stop_ids_.push_back(*id);
  }
  if (eos_id_ < 0 && !stop_ids_.empty()) eos_id_ = stop_ids_.front();
  if (eos_id_ >= 0 && std::find(stop_ids_.begin(), stop_ids_.end(), eos_id_) == stop_ids_.end())
    stop_ids_.push_back(eos_id_);
  const int32_t pad = opt(cfg.pad_token);
  pad_id_ = pad >= 0 ? pad : (eos_id_ >= 0 ? eos_id_ : 0);
}

ChatTemplate ChatTemplate::resolve(const std::string& name, const Tokenizer& tok, const TokenizerConfig& cfg) {
  if (name.empty() || name == "auto") {
    LT_CHECK(!cfg.chat_template.empty(),
             "template: 'auto' needs the model's chat template (chat_template.jinja or tokenizer_config.json's "
             "chat_template; {}); set `template` to one of: chatml, llama3, none",
             cfg.origin.empty() ? "no tokenizer_config.json found" : cfg.origin);
    return ChatTemplate(cfg.chat_template, tok, cfg);
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
// Messages as HF passes them to the template: {"role", "content"} in that order.
ojson messages_json(const std::vector<Message>& msgs) {
  ojson m = ojson::array();
  for (const auto& x : msgs) m.push_back(ojson{{"role", x.role}, {"content", x.content}});
  return m;
}

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
    case TemplateKind::Jinja:
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
  if (kind_ == TemplateKind::Jinja) return encode_jinja(msgs, train_on_inputs);
  Encoded e;
  if (kind_ == TemplateKind::Llama3) append_id(e, bos_, train_on_inputs);
  for (const auto& m : msgs) append_turn(e, m, train_on_inputs);
  return e;
}

std::vector<int32_t> ChatTemplate::encode_prompt(const std::vector<Message>& msgs) const {
  if (kind_ == TemplateKind::Jinja) {
    return encode_rendered(messages_json(msgs), true);
  }
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
    case TemplateKind::Jinja:
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

jinja::RenderResult ChatTemplate::render(const ojson& messages, bool add_generation_prompt, const ojson& extra) const {
  LT_CHECK(jinja_, "template {}: render() needs a Jinja chat template", template_name(kind_));
  jinja::Value ctx = jinja::Value::object();
  ctx.dict->set("messages", jinja::from_json(messages));
  ctx.dict->set("add_generation_prompt", jinja::Value(add_generation_prompt));
  auto tokv = [](const std::string& s) { return s.empty() ? jinja::Value::none() : jinja::Value(s); };
  ctx.dict->set("bos_token", tokv(cfg_.bos_token));
  ctx.dict->set("eos_token", tokv(cfg_.eos_token));
  ctx.dict->set("pad_token", tokv(cfg_.pad_token));
  ctx.dict->set("unk_token", tokv(cfg_.unk_token));
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) ctx.dict->set(it.key(), jinja::from_json(it.value()));
  return jinja_->render(ctx);
}

std::vector<int32_t> ChatTemplate::encode_rendered(const ojson& messages, bool add_generation_prompt, const ojson& extra) const {
  return tok_.encode(render(messages, add_generation_prompt, extra).text);
}

namespace {
// Number of leading tokens of `ids` that encoding `prefix` alone reproduces (+1 when the prefix's
// last token straddles the boundary and `round_up`).
size_t tokens_within(const Tokenizer& tok, const std::string& prefix, const std::vector<int32_t>& ids, bool round_up) {
  if (prefix.empty()) return 0;
  const auto p = tok.encode(prefix);
  size_t n = 0;
  while (n < p.size() && n < ids.size() && p[n] == ids[n]) ++n;
  if (round_up && n < p.size() && n < ids.size()) ++n;
  return n;
}
}  // namespace

Encoded ChatTemplate::encode_jinja(const std::vector<Message>& msgs, bool train_on_inputs) const {
  const ojson m = messages_json(msgs);
  const jinja::RenderResult full = render(m, false);
  Encoded e;
  e.ids = tok_.encode(full.text);
  e.loss.assign(e.ids.size(), train_on_inputs ? 1 : 0);
  if (train_on_inputs) return e;
  // Loss ranges (bytes of the rendered text).
  std::vector<std::pair<size_t, size_t>> ranges;
  if (jinja_->has_generation_blocks()) {
    ranges = full.generation;
  } else {
    size_t cursor = 0;
    for (size_t i = 0; i < msgs.size(); ++i) {
      if (msgs[i].role != "assistant") continue;
      const ojson before(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(i));
      const std::string a = render(before, true).text;
      // The conversation up to this turn; the full render when it is the last message.
      const std::string b =
          i + 1 == msgs.size() ? full.text : render(ojson(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(i) + 1), false).text;
      size_t beg, end;
      if (b.size() >= a.size() && b.compare(0, a.size(), a) == 0 && full.text.compare(0, b.size(), b) == 0) {
        beg = a.size();
        end = b.size();
      } else {  // not prefix-stable (e.g. earlier think blocks dropped): the content's own span
        const std::string& c = msgs[i].content;
        const size_t p = c.empty() ? std::string::npos : full.text.find(c, cursor);
        if (p == std::string::npos) continue;
        beg = p;
        end = p + c.size();
        // plus the end-of-turn text the template writes after it (as rendered with this turn last)
        const size_t q = b.rfind(c);
        if (q != std::string::npos) {
          std::string tail = b.substr(q + c.size());
          while (!tail.empty() && std::isspace(static_cast<unsigned char>(tail.back()))) tail.pop_back();
          if (full.text.compare(end, tail.size(), tail) == 0) end += tail.size();
        }
      }
      // Trailing whitespace after the end-of-turn marker is not the model's to predict.
      while (end > beg && std::isspace(static_cast<unsigned char>(full.text[end - 1]))) --end;
      ranges.emplace_back(beg, end);
      cursor = end;
    }
  }
  // Bytes -> tokens: a token carries loss when its text overlaps a range (HF's char_to_token rule: the
  // token holding the first byte through the token holding the last). From the tokens' own bytes when
  // they spell the text (byte-level BPE), else by re-encoding the text before each boundary.
  std::vector<size_t> starts;
  if (tok_.token_starts(full.text, e.ids, starts)) {
    for (auto [b, en] : ranges)
      for (size_t k = 0; k < e.ids.size(); ++k)
        if (starts[k + 1] > b && starts[k] < en) e.loss[k] = 1;
    return e;
  }
  for (auto [b, en] : ranges) {
    const size_t tb = tokens_within(tok_, full.text.substr(0, b), e.ids, false);
    const size_t te = tokens_within(tok_, full.text.substr(0, en), e.ids, true);
    for (size_t k = tb; k < te && k < e.loss.size(); ++k) e.loss[k] = 1;
  }
  return e;
}

}  // namespace lt::data
