// Normalizers of tokenizer.json (HF semantics): NFC NFD NFKC NFKD (ICU), Replace (string or regex),
// Prepend, Lowercase (per code point, full mapping), Strip, StripAccents, Sequence.
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include "data/component_util.h"
#include "data/components.h"
#include "data/regex.h"
#include "data/unicode.h"

namespace lt::data {

using namespace detail;

namespace {

class UnicodeNorm : public Normalizer {
 public:
  explicit UnicodeNorm(std::string form) : form_(std::move(form)) {}
  void apply(std::string& s) const override { s = unicode_normalize(s, form_); }

 private:
  std::string form_;
};

class Replace : public Normalizer {
 public:
  Replace(const json& j, const std::string& w) {
    const json& pat = field(j, "pattern", w);
    content_ = get_str(j, "content", w);
    LT_CHECK(pat.is_object() && (pat.contains("String") || pat.contains("Regex")),
             "{}.pattern: expected {{\"String\": ...}} or {{\"Regex\": ...}}, got {}", w, pat.dump());
    if (pat.contains("String")) {
      literal_ = get_str(pat, "String", w + ".pattern");
      LT_CHECK(!literal_.empty(), "{}.pattern.String: must not be empty", w);
    } else {
      re_ = std::make_unique<Regex>(get_str(pat, "Regex", w + ".pattern"), w + ".pattern.Regex");
    }
  }
  void apply(std::string& s) const override { s = replace_all(s); }
  std::string replace_all(std::string_view s) const {
    std::string out;
    out.reserve(s.size() + 8);
    if (re_) {
      std::vector<std::pair<uint32_t, uint32_t>> m;
      re_->find_all(s, m);
      size_t prev = 0;
      for (auto [b, e] : m) {
        out.append(s.substr(prev, b - prev));
        out += content_;
        prev = e;
      }
      out.append(s.substr(prev));
      return out;
    }
    size_t prev = 0;
    for (size_t pos = s.find(literal_); pos != std::string_view::npos; pos = s.find(literal_, prev)) {
      out.append(s.substr(prev, pos - prev));
      out += content_;
      prev = pos + literal_.size();
    }
    out.append(s.substr(prev));
    return out;
  }

 private:
  std::string literal_, content_;
  std::unique_ptr<Regex> re_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : p_(std::move(p)) {}
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, p_);
  }

 private:
  std::string p_;
};

class Lowercase : public Normalizer {
 public:
  void apply(std::string& s) const override {
    bool ascii = true;
    for (unsigned char c : s) ascii = ascii && c < 0x80;
    if (ascii) {
      for (char& c : s) c = static_cast<char>((c >= 'A' && c <= 'Z') ? c + 32 : c);
      return;
    }
    const Utf8Text t = utf8_decode(s);
    std::string out;
    out.reserve(s.size());
    for (char32_t cp : t.cps) {  // per code point, like Rust's char::to_lowercase (no context)
      UChar src[2], dst[8];
      int32_t n = 0;
      U16_APPEND_UNSAFE(src, n, static_cast<UChar32>(cp));
      UErrorCode err = U_ZERO_ERROR;
      const int32_t m = u_strToLower(dst, 8, src, n, "", &err);
      if (U_FAILURE(err)) { utf8_append(out, cp); continue; }
      for (int32_t i = 0; i < m;) {
        UChar32 c;
        U16_NEXT(dst, i, m, c);
        utf8_append(out, static_cast<char32_t>(c));
      }
    }
    s = std::move(out);
  }
};

class Strip : public Normalizer {
 public:
  Strip(bool l, bool r) : l_(l), r_(r) {}
  void apply(std::string& s) const override {
    const Utf8Text t = utf8_decode(s);
    size_t b = 0, e = t.cps.size();
    if (l_) while (b < e && is_whitespace(t.cps[b])) ++b;
    if (r_) while (e > b && is_whitespace(t.cps[e - 1])) --e;
    s = s.substr(t.offsets[b], t.offsets[e] - t.offsets[b]);
  }

 private:
  bool l_, r_;
};

class StripAccents : public Normalizer {
 public:
  void apply(std::string& s) const override {
    const Utf8Text t = utf8_decode(s);
    std::string out;
    for (char32_t c : t.cps)
      if (u_charType(static_cast<UChar32>(c)) != U_NON_SPACING_MARK) utf8_append(out, c);
    s = std::move(out);
  }
};

class Sequence : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> list;
  void apply(std::string& s) const override {
    for (const auto& n : list) n->apply(s);
  }
};

}  // namespace

std::unique_ptr<Normalizer> parse_normalizer(const json& j, const std::string& w) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, w);
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") return std::make_unique<UnicodeNorm>(type);
  if (type == "Replace") return std::make_unique<Replace>(j, w);
  if (type == "Prepend") return std::make_unique<Prepend>(get_str(j, "prepend", w));
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Strip") return std::make_unique<Strip>(get_bool(j, "strip_left", true, w), get_bool(j, "strip_right", true, w));
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Sequence") {
    auto seq = std::make_unique<Sequence>();
    const json& list = field(j, "normalizers", w);
    LT_CHECK(list.is_array(), "{}.normalizers: expected an array", w);
    for (size_t i = 0; i < list.size(); ++i) {
      auto n = parse_normalizer(list[i], fmt::format("{}.normalizers[{}]", w, i));
      if (n) seq->list.push_back(std::move(n));
    }
    return seq;
  }
  fail("{}.type: unsupported normalizer '{}'; supported: NFC, NFD, NFKC, NFKD, Replace, Prepend, Lowercase, Strip, "
       "StripAccents, Sequence, null", w, type);
}

}  // namespace lt::data
