// Decoders of tokenizer.json (HF semantics, decode_chain on the token strings): ByteLevel,
// Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence.
#include "data/bpe.h"
#include "data/component_util.h"
#include "data/components.h"
#include "data/regex.h"
#include "data/unicode.h"

namespace lt::data {

using namespace detail;

namespace {

// A token's ByteLevel chars back to bytes; a token with a char outside the map stays as it is.
std::string bytelevel_bytes(const std::string& tok) {
  std::string mapped;
  mapped.reserve(tok.size());
  for (size_t i = 0; i < tok.size();) {
    char32_t c;
    i += utf8_next(tok, i, c);
    const int b = unicode_to_byte(c);
    if (b < 0) return tok;
    mapped.push_back(static_cast<char>(b));
  }
  return mapped;
}

class ByteLevelDec : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& toks, bool raw) const override {
    std::string all;
    for (const auto& t : toks) all += bytelevel_bytes(t);
    toks.assign(1, raw ? std::move(all) : utf8_sanitize(all));
  }
};

class MetaspaceDec : public Decoder {
 public:
  MetaspaceDec(std::string rep, bool prefix) : rep_(std::move(rep)), prefix_(prefix) {}
  void decode_chain(std::vector<std::string>& toks, bool) const override {
    for (size_t i = 0; i < toks.size(); ++i) {
      std::string out;
      const std::string& t = toks[i];
      for (size_t p = 0; p < t.size();) {
        if (t.compare(p, rep_.size(), rep_) == 0) {
          if (!(i == 0 && prefix_)) out.push_back(' ');
          p += rep_.size();
        } else {
          out.push_back(t[p++]);
        }
      }
      toks[i] = std::move(out);
    }
  }

 private:
  std::string rep_;
  bool prefix_;
};

int byte_token(const std::string& t) {  // "<0xAB>" -> 0xAB, else -1
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1; };
  const int h = hex(t[3]), l = hex(t[4]);
  return h < 0 || l < 0 ? -1 : h * 16 + l;
}

class ByteFallbackDec : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& toks, bool raw) const override {
    std::vector<std::string> out;
    std::string bytes;
    size_t n_bytes = 0;
    auto flush = [&] {
      if (n_bytes == 0) return;
      if (raw || utf8_valid(bytes)) {
        out.push_back(bytes);
      } else {
        std::string rep;
        for (size_t k = 0; k < n_bytes; ++k) rep += "\xEF\xBF\xBD";
        out.push_back(rep);
      }
      bytes.clear();
      n_bytes = 0;
    };
    for (auto& t : toks) {
      const int b = byte_token(t);
      if (b >= 0) {
        bytes.push_back(static_cast<char>(b));
        ++n_bytes;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    toks.swap(out);
  }
};

class FuseDec : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& toks, bool) const override {
    std::string all;
    for (const auto& t : toks) all += t;
    toks.assign(1, std::move(all));
  }
};

class StripDec : public Decoder {
 public:
  StripDec(std::string c, int64_t start, int64_t stop) : c_(std::move(c)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& toks, bool) const override {
    for (auto& t : toks) {
      size_t b = 0, e = t.size();
      for (int64_t k = 0; k < start_ && e - b >= c_.size() && t.compare(b, c_.size(), c_) == 0; ++k) b += c_.size();
      for (int64_t k = 0; k < stop_ && e - b >= c_.size() && t.compare(e - c_.size(), c_.size(), c_) == 0; ++k)
        e -= c_.size();
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string c_;
  int64_t start_, stop_;
};

class ReplaceDec : public Decoder {
 public:
  ReplaceDec(const json& j, const std::string& w) : norm_(parse_normalizer(j, w)) {}
  void decode_chain(std::vector<std::string>& toks, bool) const override {
    for (auto& t : toks) norm_->apply(t);
  }

 private:
  std::unique_ptr<Normalizer> norm_;  // the Replace normalizer does the same replacement
};

class SequenceDec : public Decoder {
 public:
  std::vector<std::unique_ptr<Decoder>> list;
  void decode_chain(std::vector<std::string>& toks, bool raw) const override {
    for (const auto& d : list) d->decode_chain(toks, raw);
  }
};

}  // namespace

DecoderInfo parse_decoder(const json& j, const std::string& w) {
  DecoderInfo info;
  if (j.is_null()) return info;
  const std::string type = type_of(j, w);
  if (type == "ByteLevel") {
    info.dec = std::make_unique<ByteLevelDec>();
    info.pure_byte_level = true;
  } else if (type == "Metaspace") {
    std::string scheme = "always";
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) scheme = get_str(j, "prepend_scheme", w);
    else if (!get_bool(j, "add_prefix_space", true, w)) scheme = "never";
    info.dec = std::make_unique<MetaspaceDec>(get_str(j, "replacement", w), scheme != "never");
  } else if (type == "ByteFallback") {
    info.dec = std::make_unique<ByteFallbackDec>();
  } else if (type == "Fuse") {
    info.dec = std::make_unique<FuseDec>();
  } else if (type == "Strip") {
    info.dec = std::make_unique<StripDec>(get_str(j, "content", w), get_int(j, "start", 0, w), get_int(j, "stop", 0, w));
  } else if (type == "Replace") {
    info.dec = std::make_unique<ReplaceDec>(j, w);
  } else if (type == "Sequence") {
    auto seq = std::make_unique<SequenceDec>();
    const json& list = field(j, "decoders", w);
    LT_CHECK(list.is_array(), "{}.decoders: expected an array", w);
    for (size_t i = 0; i < list.size(); ++i) {
      DecoderInfo sub = parse_decoder(list[i], fmt::format("{}.decoders[{}]", w, i));
      if (sub.dec) seq->list.push_back(std::move(sub.dec));
    }
    info.pure_byte_level = seq->list.size() == 1 && dynamic_cast<ByteLevelDec*>(seq->list[0].get());
    info.dec = std::move(seq);
  } else {
    fail("{}.type: unsupported decoder '{}'; supported: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, "
         "Sequence, null", w, type);
  }
  return info;
}

}  // namespace lt::data
