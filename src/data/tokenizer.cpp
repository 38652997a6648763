#include "data/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/component_util.h"
#include "data/unicode.h"

namespace lt::data {

using json = nlohmann::json;

namespace {

using detail::field;
using detail::get_bool;
using detail::get_str;

// ByteLevel decoding of one token: each char back to its byte; a token with any char outside the
// map is kept as its raw UTF-8 (HF's rule).
std::string bytelevel_token_bytes(const std::string& tok) {
  const Utf8Text u = utf8_decode(tok);
  std::string mapped;
  for (char32_t c : u.cps) {
    const int b = unicode_to_byte(c);
    if (b < 0) return tok;
    mapped.push_back(static_cast<char>(b));
  }
  return mapped;
}

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  LT_CHECK(f.good(), "tokenizer: cannot open '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
  return from_json(j, path);
}

Tokenizer Tokenizer::from_json(const json& j, const std::string& origin) {
  try {
    return from_json_checked(j, origin);
  } catch (const json::exception& e) {  // a value of an unexpected type somewhere we did not check
    fail("{}: malformed tokenizer.json: {}", origin, e.what());
  }
}

namespace {

// tokenizer.json's "model" (BPE only): its options, vocabulary and merges.
struct BpeParts {
  BpeOptions opt;
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
};

BpeParts parse_bpe_model(const json& j, const std::string& origin) {
  const std::string mw = origin + ": model";
  const json& model = field(j, "model", origin);
  LT_CHECK(model.is_object(), "{}: expected an object", mw);
  const std::string mtype = model.contains("type") ? get_str(model, "type", mw) : "BPE";
  LT_CHECK(mtype == "BPE", "{}.type: unsupported model '{}'; supported: BPE", mw, mtype);
  BpeParts b;
  BpeOptions& opt = b.opt;
  opt.byte_fallback = get_bool(model, "byte_fallback", false, mw);
  opt.fuse_unk = get_bool(model, "fuse_unk", false, mw);
  opt.ignore_merges = get_bool(model, "ignore_merges", false, mw);
  if (model.contains("unk_token") && !model["unk_token"].is_null()) opt.unk_token = get_str(model, "unk_token", mw);
  opt.continuing_subword_prefix = detail::opt_str(model, "continuing_subword_prefix", "", mw);
  opt.end_of_word_suffix = detail::opt_str(model, "end_of_word_suffix", "", mw);
  auto dit = model.find("dropout");
  LT_CHECK(dit == model.end() || dit->is_null() || (dit->is_number() && dit->get<double>() == 0.0),
           "{}.dropout: BPE dropout is not supported (must be null)", mw);
  const json& vocab = field(model, "vocab", mw);
  LT_CHECK(vocab.is_object(), "{}.vocab: expected an object {{token: id}}, got {}", mw, vocab.type_name());
  b.vocab.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    LT_CHECK(it.value().is_number_integer(), "{}.vocab['{}']: expected an integer id, got {}", mw, it.key(),
             it.value().type_name());
    b.vocab.emplace(it.key(), it.value().get<int32_t>());
  }
  const json& merges = field(model, "merges", mw);
  LT_CHECK(merges.is_array(), "{}.merges: expected an array, got {}", mw, merges.type_name());
  b.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& e = merges[i];
    if (e.is_string()) {  // legacy "a b"
      const std::string s = e.get<std::string>();
      const auto sp = s.find(' ');
      LT_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos,
               "{}.merges[{}]: expected \"left right\", got '{}'", mw, i, s);
      b.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      LT_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
               "{}.merges[{}]: expected [\"left\", \"right\"] or \"left right\", got {}", mw, i, e.dump());
      b.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    }
  }
  return b;
}

}  // namespace

Tokenizer Tokenizer::from_json_checked(const json& j, const std::string& origin) {
  LT_CHECK(j.is_object(), "{}: expected a JSON object at top level, got {}", origin, j.type_name());
  Tokenizer t;
  BpeParts bpe = parse_bpe_model(j, origin);
  // normalizer, pre_tokenizer, decoder
  if (j.contains("normalizer")) t.normalizer_ = parse_normalizer(j["normalizer"], origin + ": normalizer");
  {
    PreTokenizerInfo pi = parse_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(),
                                              origin + ": pre_tokenizer");
    t.pre_ = std::move(pi.pre);
    t.byte_level_ = pi.byte_level;
  }
  bpe.opt.byte_level = t.byte_level_;
  t.bpe_ = std::make_shared<BpeModel>(std::move(bpe.vocab), bpe.merges, bpe.opt, origin);
  t.vocab_size_ = static_cast<int32_t>(t.bpe_->id_to_token().size());
  {
    DecoderInfo di = parse_decoder(j.contains("decoder") ? j["decoder"] : json(), origin + ": decoder");
    t.decoder_ = std::move(di.dec);
    t.decoder_bytelevel_ = di.pure_byte_level;
  }
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) t.parse_added_tokens(j["added_tokens"], origin);
  if (j.contains("post_processor")) t.parse_post_processor(j["post_processor"], origin + ": post_processor");
  t.build_lookup_tables();
  return t;
}

void Tokenizer::parse_added_tokens(const json& at, const std::string& origin) {
  LT_CHECK(at.is_array(), "{}: added_tokens: expected an array, got {}", origin, at.type_name());
  for (size_t i = 0; i < at.size(); ++i) {
    const std::string w = fmt::format("{}: added_tokens[{}]", origin, i);
    LT_CHECK(at[i].is_object(), "{}: expected an object", w);
    AddedToken a;
    const json& id = field(at[i], "id", w);
    LT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < kMaxVocab,
             "{}.id: expected an integer in 0..{}, got {}", w, kMaxVocab - 1, id.dump());
    a.id = id.get<int32_t>();
    a.content = get_str(at[i], "content", w);
    LT_CHECK(!a.content.empty(), "{}.content: must not be empty", w);
    a.special = get_bool(at[i], "special", false, w);
    a.lstrip = get_bool(at[i], "lstrip", false, w);
    a.rstrip = get_bool(at[i], "rstrip", false, w);
    a.single_word = get_bool(at[i], "single_word", false, w);
    a.normalized = get_bool(at[i], "normalized", !a.special, w);
    auto vid = bpe_->vocab().find(a.content);
    LT_CHECK(vid == bpe_->vocab().end() || vid->second == a.id,
             "{}: token '{}' has id {} but model.vocab gives it id {}", w, a.content, a.id, vid->second);
    added_by_content_[a.content] = a.id;
    added_by_id_[a.id] = added_.size();
    vocab_size_ = std::max(vocab_size_, a.id + 1);
    added_.push_back(std::move(a));
  }
}

// post_processor: null, ByteLevel (no-op on ids), TemplateProcessing, or a Sequence of these.
void Tokenizer::parse_post_processor(const json& p, const std::string& w) {
  if (p.is_null()) return;
  const std::string type = get_str(p, "type", w);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = field(p, "processors", w);
    for (size_t i = 0; i < list.size(); ++i) parse_post_processor(list[i], fmt::format("{}.processors[{}]", w, i));
    return;
  }
  LT_CHECK(type == "TemplateProcessing", "{}.type: unsupported post-processor '{}'; supported: ByteLevel, "
           "TemplateProcessing, Sequence, null", w, type);
  const json& single = field(p, "single", w);
  const json& specials = field(p, "special_tokens", w);
  bool seen_a = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& e = single[i];
    const std::string ew = fmt::format("{}.single[{}]", w, i);
    if (e.contains("Sequence")) {
      seen_a = true;
    } else if (e.contains("SpecialToken")) {
      const std::string name = get_str(e["SpecialToken"], "id", ew + ".SpecialToken");
      auto it = specials.find(name);
      LT_CHECK(it != specials.end(), "{}: special token '{}' is not in {}.special_tokens", ew, name, w);
      const json& ids = field(*it, "ids", w + ".special_tokens." + name);
      for (const auto& id : ids) {
        LT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < vocab_size_,
                 "{}.special_tokens.{}.ids: expected ids in 0..{}, got {}", w, name, vocab_size_ - 1, id.dump());
        (seen_a ? post_suffix_ : post_prefix_).push_back(id.get<int32_t>());
      }
    } else {
      fail("{}: expected {{\"Sequence\"|\"SpecialToken\": ...}}, got {}", ew, e.dump());
    }
  }
}

// Lookup tables for the hot paths: added tokens by first byte, every id's bytes.
void Tokenizer::build_lookup_tables() {
  for (const auto& a : added_) has_normalized_added_ = has_normalized_added_ || a.normalized;
  for (size_t i = 0; i < added_.size(); ++i)
    added_first_[added_[i].normalized ? 1 : 0][static_cast<unsigned char>(added_[i].content[0])].push_back(
        static_cast<uint32_t>(i));
  auto id_bytes = std::make_shared<std::vector<std::string>>(static_cast<size_t>(vocab_size_));
  auto id_known = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(vocab_size_), 0);
  const auto& itt = bpe_->id_to_token();
  for (size_t id = 0; id < itt.size(); ++id) {
    if (itt[id].empty()) continue;
    (*id_known)[id] = 1;
    (*id_bytes)[id] = decoder_bytelevel_ ? bytelevel_token_bytes(itt[id]) : itt[id];
  }
  for (const auto& a : added_) {
    (*id_known)[a.id] = 1;
    (*id_bytes)[a.id] = decoder_bytelevel_ ? bytelevel_token_bytes(a.content) : a.content;
  }
  id_bytes_ = std::move(id_bytes);
  id_known_ = std::move(id_known);
}

std::vector<Tokenizer::Piece> Tokenizer::split_added(std::string_view text, bool normalized_kind) const {
  std::vector<Piece> out;
  size_t plain_begin = 0, i = 0;
  auto is_word = [](char32_t c) { return is_letter(c) || is_number(c) || c == '_'; };
  while (i < text.size()) {
    // Leftmost-longest: at the first position where any token matches, take the longest one.
    const AddedToken* best = nullptr;
    for (uint32_t k : added_first_[normalized_kind ? 1 : 0][static_cast<unsigned char>(text[i])]) {
      const AddedToken& a = added_[k];
      if (text.compare(i, a.content.size(), a.content) != 0) continue;
      if (best && best->content.size() >= a.content.size()) continue;
      if (a.single_word) {
        const Utf8Text before = utf8_decode(text.substr(0, i));
        const Utf8Text after = utf8_decode(text.substr(i + a.content.size(), 4));
        if ((!before.cps.empty() && is_word(before.cps.back())) || (!after.cps.empty() && is_word(after.cps[0])))
          continue;
      }
      best = &a;
    }
    if (!best) {
      ++i;
      continue;
    }
    size_t b = i, e = i + best->content.size();
    if (best->lstrip) {
      while (b > plain_begin && is_whitespace(static_cast<unsigned char>(text[b - 1]))) --b;
    }
    if (best->rstrip) {
      while (e < text.size() && is_whitespace(static_cast<unsigned char>(text[e]))) ++e;
    }
    if (b > plain_begin) out.push_back({plain_begin, b, -1});
    out.push_back({b, e, best->id});
    plain_begin = i = e;
  }
  if (plain_begin < text.size()) out.push_back({plain_begin, text.size(), -1});
  return out;
}

void Tokenizer::encode_pretokenized(std::string_view normalized, std::vector<int32_t>& out, bool at_start) const {
  if (!pre_) {
    bpe_->encode_word(normalized, out);
    return;
  }
  thread_local Pieces p;
  p.reset(normalized);
  pre_->apply(p, at_start);
  for (size_t i = 0; i < p.spans.size(); ++i) bpe_->encode_word(p.piece(i), out);
}

std::string Tokenizer::normalize(std::string_view text) const {
  std::string s(text);
  if (normalizer_) normalizer_->apply(s);
  return s;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view normalized, bool at_start) const {
  Pieces p;
  p.reset(normalized);
  if (pre_) pre_->apply(p, at_start);
  std::vector<std::string> out;
  for (size_t i = 0; i < p.spans.size(); ++i) out.emplace_back(p.piece(i));
  return out;
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out, bool parse_normalized_added,
                             bool at_start) const {
  std::string norm(text);
  if (normalizer_) normalizer_->apply(norm);
  if (!parse_normalized_added || !has_normalized_added_) {
    encode_pretokenized(norm, out, at_start);
    return;
  }
  for (const Piece& p : split_added(norm, true)) {
    if (p.added_id >= 0) out.push_back(p.added_id);
    else encode_pretokenized(std::string_view(norm).substr(p.begin, p.end - p.begin), out, at_start && p.begin == 0);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text_in, bool add_special_tokens, bool parse_special) const {
  const std::string text = utf8_sanitize(text_in);
  std::vector<int32_t> out;
  if (add_special_tokens) out = post_prefix_;
  if (!parse_special) {
    encode_plain(text, out, false, true);
  } else {
    for (const Piece& p : split_added(text, false)) {
      if (p.added_id >= 0) out.push_back(p.added_id);
      else encode_plain(std::string_view(text).substr(p.begin, p.end - p.begin), out, true, p.begin == 0);
    }
  }
  if (add_special_tokens) out.insert(out.end(), post_suffix_.begin(), post_suffix_.end());
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return utf8_sanitize(decode_impl(ids, skip_special_tokens, false));
}

std::string Tokenizer::decode_bytes(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return decode_impl(ids, skip_special_tokens, true);
}

std::string Tokenizer::decode_impl(const std::vector<int32_t>& ids, bool skip_special_tokens, bool raw) const {
  if (decoder_bytelevel_) {  // fast path: per-id bytes
    std::string bytes;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size_ || !(*id_known_)[id]) continue;  // unknown ids are skipped, as HF does
      if (skip_special_tokens && is_special(id)) continue;
      bytes += (*id_bytes_)[id];
    }
    return bytes;
  }
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_ || !(*id_known_)[id]) continue;
    if (skip_special_tokens && is_special(id)) continue;
    toks.push_back((*id_bytes_)[id]);
  }
  if (!decoder_) {  // no decoder: HF joins tokens with spaces
    std::string s;
    for (size_t i = 0; i < toks.size(); ++i) s += (i ? " " : "") + toks[i];
    return s;
  }
  decoder_->decode_chain(toks, raw);
  std::string s;
  for (const auto& t : toks) s += t;
  return s;
}

bool Tokenizer::token_starts(std::string_view text, const std::vector<int32_t>& ids, std::vector<size_t>& starts) const {
  if (!decoder_bytelevel_) return false;
  starts.clear();
  starts.reserve(ids.size() + 1);
  size_t at = 0;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_ || !(*id_known_)[id]) return false;
    const std::string& b = (*id_bytes_)[id];
    if (text.compare(at, b.size(), b) != 0) return false;
    starts.push_back(at);
    at += b.size();
  }
  starts.push_back(at);
  return at == text.size();
}

std::optional<int32_t> Tokenizer::token_to_id(const std::string& token) const {
  if (auto it = added_by_content_.find(token); it != added_by_content_.end()) return it->second;
  if (auto it = bpe_->vocab().find(token); it != bpe_->vocab().end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (auto a = added_by_id_.find(id); a != added_by_id_.end()) return added_[a->second].content;
  if (id >= 0 && id < static_cast<int32_t>(bpe_->id_to_token().size())) return bpe_->id_to_token()[id];
  return {};
}

bool Tokenizer::is_special(int32_t id) const {
  auto a = added_by_id_.find(id);
  return a != added_by_id_.end() && added_[a->second].special;
}

}  // namespace lt::data
