// Pre-tokenizers of tokenizer.json (HF semantics): Split (string or regex pattern, all five
// behaviours, invert), ByteLevel (add_prefix_space, use_regex = the GPT-2 pattern), Digits,
// Metaspace, Whitespace, WhitespaceSplit, Punctuation, Sequence.
#include <unicode/uchar.h>

#include "data/component_util.h"
#include "data/components.h"
#include "data/regex.h"
#include "data/unicode.h"

namespace lt::data {

using namespace detail;

SplitBehavior detail::parse_behavior(const std::string& s, const std::string& w) {
  if (s == "Removed") return SplitBehavior::Removed;
  if (s == "Isolated") return SplitBehavior::Isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (s == "Contiguous") return SplitBehavior::Contiguous;
  fail("{}: unknown split behavior '{}'; supported: Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous",
       w, s);
}

void detail::apply_behavior(std::vector<Match>& m, SplitBehavior beh, std::vector<std::pair<uint32_t, uint32_t>>& out) {
  auto emit = [&](std::pair<uint32_t, uint32_t> r) {
    if (r.second > r.first) out.push_back(r);
  };
  switch (beh) {
    case SplitBehavior::Removed:
      for (auto& [r, is] : m)
        if (!is) emit(r);
      return;
    case SplitBehavior::Isolated:
      for (auto& [r, is] : m) emit(r);
      return;
    case SplitBehavior::MergedWithPrevious: {
      std::vector<std::pair<uint32_t, uint32_t>> acc;
      bool prev = false;
      for (auto& [r, is] : m) {
        if (is && !prev && !acc.empty()) acc.back().second = r.second;
        else acc.push_back(r);
        prev = is;
      }
      for (auto r : acc) emit(r);
      return;
    }
    case SplitBehavior::MergedWithNext: {
      std::vector<std::pair<uint32_t, uint32_t>> acc;
      bool prev = false;
      for (size_t k = m.size(); k-- > 0;) {
        auto& [r, is] = m[k];
        if (is && !prev && !acc.empty()) acc.back().first = r.first;
        else acc.push_back(r);
        prev = is;
      }
      for (size_t k = acc.size(); k-- > 0;) emit(acc[k]);
      return;
    }
    case SplitBehavior::Contiguous: {
      std::vector<std::pair<uint32_t, uint32_t>> acc;
      bool prev = false;
      for (auto& [r, is] : m) {
        if (is == prev && !acc.empty()) acc.back().second = r.second;
        else acc.push_back(r);
        prev = is;
      }
      for (auto r : acc) emit(r);
      return;
    }
  }
}

namespace {

// HF's Pattern for a char predicate: each matching char is a match of its own.
template <class Pred>
void char_matches(std::string_view s, uint32_t b, uint32_t e, Pred pred, std::vector<Match>& out) {
  uint32_t last = b, i = b;
  while (i < e) {
    char32_t cp;
    const uint32_t n = static_cast<uint32_t>(utf8_next(s, i, cp));
    if (pred(cp)) {
      if (last < i) out.push_back({{last, i}, false});
      out.push_back({{i, i + n}, true});
      last = i + n;
    }
    i += n;
  }
  if (last < e) out.push_back({{last, e}, false});
}

// Regex matches over [b, e) as a covering list.
void regex_matches(const Regex& re, std::string_view s, uint32_t b, uint32_t e, std::vector<Match>& out,
                   std::vector<std::pair<uint32_t, uint32_t>>& tmp) {
  tmp.clear();
  re.find_all(s.substr(b, e - b), tmp);
  uint32_t prev = b;
  for (auto [mb, me] : tmp) {
    if (prev < b + mb) out.push_back({{prev, b + mb}, false});
    out.push_back({{b + mb, b + me}, true});
    prev = b + me;
  }
  if (prev < e) out.push_back({{prev, e}, false});
}

// A pre-tokenizer that only splits (does not change the text).
class Splitter : public PreTokenizer {
 public:
  void apply(Pieces& p, bool) const override {
    std::vector<std::pair<uint32_t, uint32_t>> out;
    out.reserve(p.spans.size() * 4);
    std::vector<Match> m;
    for (auto [b, e] : p.spans) {
      m.clear();
      matches(p.buf, b, e, m);
      if (invert_)
        for (auto& x : m) x.second = !x.second;
      apply_behavior(m, beh_, out);
    }
    p.spans.swap(out);
  }

 protected:
  virtual void matches(std::string_view s, uint32_t b, uint32_t e, std::vector<Match>& out) const = 0;
  SplitBehavior beh_ = SplitBehavior::Isolated;
  bool invert_ = false;
};

std::string regex_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

class RegexSplit : public Splitter {
 public:
  RegexSplit(const std::string& pattern, const std::string& where, SplitBehavior beh, bool invert)
      : re_(pattern, where) {
    beh_ = beh;
    invert_ = invert;
  }

 protected:
  void matches(std::string_view s, uint32_t b, uint32_t e, std::vector<Match>& out) const override {
    thread_local std::vector<std::pair<uint32_t, uint32_t>> tmp;
    regex_matches(re_, s, b, e, out, tmp);
  }

 private:
  Regex re_;
};

template <class Pred>
class CharSplit : public Splitter {
 public:
  CharSplit(Pred pred, SplitBehavior beh) : pred_(pred) { beh_ = beh; }

 protected:
  void matches(std::string_view s, uint32_t b, uint32_t e, std::vector<Match>& out) const override {
    char_matches(s, b, e, pred_, out);
  }

 private:
  Pred pred_;
};
template <class Pred>
std::unique_ptr<PreTokenizer> char_split(Pred p, SplitBehavior beh) {
  return std::make_unique<CharSplit<Pred>>(p, beh);
}

bool is_numeric_rust(char32_t c) {  // Rust char::is_numeric: Nd, Nl, No
  if (c < 0x80) return c >= '0' && c <= '9';
  return is_number(c);
}
bool is_punct(char32_t c) {  // char::is_ascii_punctuation || Unicode P*
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_P_MASK) != 0;
}

constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// ByteLevel: optional prefix space, optional GPT-2 split; the byte -> char map is applied by the
// byte-level BPE (pieces stay raw bytes).
class ByteLevelPre : public PreTokenizer {
 public:
  ByteLevelPre(bool prefix, bool use_regex, const std::string& where) : prefix_(prefix) {
    if (use_regex) re_ = std::make_unique<RegexSplit>(kGpt2Pattern, where, SplitBehavior::Isolated, false);
  }
  void apply(Pieces& p, bool at_start) const override {
    if (prefix_) {
      Pieces q;
      for (size_t i = 0; i < p.spans.size(); ++i) {
        const auto s = p.piece(i);
        const uint32_t b = static_cast<uint32_t>(q.buf.size());
        if (s.empty() || s[0] != ' ') q.buf.push_back(' ');
        q.buf.append(s);
        q.spans.emplace_back(b, static_cast<uint32_t>(q.buf.size()));
      }
      p = std::move(q);
    }
    if (re_) re_->apply(p, at_start);
  }

 private:
  bool prefix_;
  std::unique_ptr<RegexSplit> re_;
};

class Metaspace : public PreTokenizer {
 public:
  Metaspace(std::string rep, std::string scheme, bool split) : rep_(std::move(rep)), scheme_(std::move(scheme)), split_(split) {}
  void apply(Pieces& p, bool at_start) const override {
    Pieces q;
    for (size_t i = 0; i < p.spans.size(); ++i) {
      const auto s = p.piece(i);
      const uint32_t b = static_cast<uint32_t>(q.buf.size());
      const bool starts = s.size() >= 1 && s[0] == ' ';  // ' ' becomes the replacement below
      const bool has_rep = starts || s.substr(0, rep_.size()) == rep_;
      const bool first = at_start && p.spans[i].first == 0;
      if (!has_rep && (scheme_ == "always" || (scheme_ == "first" && first))) q.buf += rep_;
      for (char c : s) {
        if (c == ' ') q.buf += rep_;
        else q.buf.push_back(c);
      }
      const uint32_t e = static_cast<uint32_t>(q.buf.size());
      if (!split_) {
        if (e > b) q.spans.emplace_back(b, e);
        continue;
      }
      // split on the replacement, MergedWithNext
      std::vector<Match> m;
      std::string_view all(q.buf);
      uint32_t prev = b;
      for (size_t pos = all.find(rep_, b); pos != std::string_view::npos && pos < e; pos = all.find(rep_, pos + rep_.size())) {
        if (prev < pos) m.push_back({{prev, static_cast<uint32_t>(pos)}, false});
        m.push_back({{static_cast<uint32_t>(pos), static_cast<uint32_t>(pos + rep_.size())}, true});
        prev = static_cast<uint32_t>(pos + rep_.size());
      }
      if (prev < e) m.push_back({{prev, e}, false});
      apply_behavior(m, SplitBehavior::MergedWithNext, q.spans);
    }
    p = std::move(q);
  }

 private:
  std::string rep_, scheme_;
  bool split_;
};

class SequencePre : public PreTokenizer {
 public:
  std::vector<std::unique_ptr<PreTokenizer>> list;
  void apply(Pieces& p, bool at_start) const override {
    for (const auto& x : list) x->apply(p, at_start);
  }
};

PreTokenizerInfo parse_one(const json& j, const std::string& w) {
  PreTokenizerInfo info;
  if (j.is_null()) return info;
  const std::string type = type_of(j, w);
  if (type == "Split") {
    const json& pat = field(j, "pattern", w);
    LT_CHECK(pat.is_object() && (pat.contains("String") || pat.contains("Regex")),
             "{}.pattern: expected {{\"String\": ...}} or {{\"Regex\": ...}}, got {}", w, pat.dump().substr(0, 200));
    const std::string re = pat.contains("Regex") ? get_str(pat, "Regex", w + ".pattern")
                                                 : regex_escape(get_str(pat, "String", w + ".pattern"));
    info.pre = std::make_unique<RegexSplit>(re, w + ".pattern", parse_behavior(get_str(j, "behavior", w), w + ".behavior"),
                                            get_bool(j, "invert", false, w));
  } else if (type == "ByteLevel") {
    info.pre = std::make_unique<ByteLevelPre>(get_bool(j, "add_prefix_space", true, w), get_bool(j, "use_regex", true, w), w);
    info.byte_level = true;
  } else if (type == "Digits") {
    info.pre = char_split(is_numeric_rust, get_bool(j, "individual_digits", false, w) ? SplitBehavior::Isolated
                                                                                    : SplitBehavior::Contiguous);
  } else if (type == "Whitespace") {
    info.pre = std::make_unique<RegexSplit>("\\w+|[^\\w\\s]+", w, SplitBehavior::Removed, true);
  } else if (type == "WhitespaceSplit") {
    info.pre = char_split(is_whitespace, SplitBehavior::Removed);
  } else if (type == "Punctuation") {
    info.pre = char_split(is_punct, parse_behavior(opt_str(j, "behavior", "Isolated", w), w + ".behavior"));
  } else if (type == "Metaspace") {
    const std::string rep = get_str(j, "replacement", w);
    LT_CHECK(utf8_decode(rep).cps.size() == 1, "{}.replacement: expected one character, got '{}'", w, rep);
    std::string scheme;
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      scheme = get_str(j, "prepend_scheme", w);
      LT_CHECK(scheme == "always" || scheme == "first" || scheme == "never",
               "{}.prepend_scheme: expected always, first or never, got '{}'", w, scheme);
    } else {
      scheme = get_bool(j, "add_prefix_space", true, w) ? "always" : "never";
    }
    info.pre = std::make_unique<Metaspace>(rep, scheme, get_bool(j, "split", true, w));
  } else if (type == "Sequence") {
    auto seq = std::make_unique<SequencePre>();
    const json& list = field(j, "pretokenizers", w);
    LT_CHECK(list.is_array(), "{}.pretokenizers: expected an array", w);
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string wi = fmt::format("{}.pretokenizers[{}]", w, i);
      LT_CHECK(!info.byte_level, "{}: a pre-tokenizer after ByteLevel is not supported (ByteLevel must be last)", wi);
      PreTokenizerInfo sub = parse_one(list[i], wi);
      info.byte_level = sub.byte_level;
      if (sub.pre) seq->list.push_back(std::move(sub.pre));
    }
    info.pre = std::move(seq);
  } else {
    fail("{}.type: unsupported pre-tokenizer '{}'; supported: Split, ByteLevel, Digits, Metaspace, Whitespace, "
         "WhitespaceSplit, Punctuation, Sequence, null", w, type);
  }
  return info;
}

}  // namespace

PreTokenizerInfo parse_pre_tokenizer(const json& j, const std::string& where) { return parse_one(j, where); }

}  // namespace lt::data
