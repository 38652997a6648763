#include "data/pretokenizer.h"

#include "core/error.h"

namespace lt::data {

namespace {

const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool is_crlf(char32_t c) { return c == '\r' || c == '\n'; }

// Case-insensitive match of one ASCII letter (lower case `want`), with Unicode simple case folding:
// U+017F LATIN SMALL LETTER LONG S folds to 's'.
bool ci_eq(char32_t c, char32_t want) {
  if (c < 0x80) return (c | 0x20) == want && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'));
  return want == 's' && c == 0x17F;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at i: returns the match length or 0.
size_t match_contraction(const std::u32string& s, size_t i) {
  const size_t n = s.size();
  if (s[i] != '\'' || i + 1 >= n) return 0;
  const char32_t c1 = s[i + 1];
  if (ci_eq(c1, 's') || ci_eq(c1, 't') || ci_eq(c1, 'm') || ci_eq(c1, 'd')) return 2;
  if (i + 2 < n) {
    const char32_t c2 = s[i + 2];
    if ((ci_eq(c1, 'r') || ci_eq(c1, 'v')) && ci_eq(c2, 'e')) return 3;
    if (ci_eq(c1, 'l') && ci_eq(c2, 'l')) return 3;
  }
  return 0;
}

size_t match_at(const std::u32string& s, size_t i, int max_digits) {
  const size_t n = s.size();
  const char32_t c = s[i];
  // 1. contractions
  if (size_t m = match_contraction(s, i)) return m;
  // 2. [^\r\n\p{L}\p{N}]?\p{L}+
  {
    size_t j = i;
    if (!is_letter(c) && !is_crlf(c) && !is_number(c)) ++j;  // the optional leading char
    if (j < n && is_letter(s[j])) {
      while (j < n && is_letter(s[j])) ++j;
      return j - i;
    }
    // Optional char taken but no letter follows: backtracking drops it, and then \p{L}+ at i fails
    // (s[i] is not a letter), so the alternative fails.
  }
  // 3. \p{N}{1,K}
  if (is_number(c)) {
    size_t j = i;
    while (j < n && is_number(s[j]) && static_cast<int>(j - i) < max_digits) ++j;
    return j - i;
  }
  // 4. ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  {
    auto punct = [](char32_t x) { return !is_whitespace(x) && !is_letter(x) && !is_number(x); };
    size_t j = i;
    if (c == ' ' && j + 1 < n && punct(s[j + 1])) ++j;
    if (j < n && punct(s[j])) {
      while (j < n && punct(s[j])) ++j;
      while (j < n && is_crlf(s[j])) ++j;
      return j - i;
    }
  }
  if (is_whitespace(c)) {
    size_t end = i;
    while (end < n && is_whitespace(s[end])) ++end;
    // 5. \s*[\r\n]+ : ends after the last CR/LF of the whitespace run.
    for (size_t k = end; k > i; --k) {
      if (is_crlf(s[k - 1])) return k - i;
    }
    // 6. \s+(?!\S) : the whole run if it reaches the end, else the run minus its last char.
    if (end == n) return end - i;
    if (end - i >= 2) return end - i - 1;
    // 7. \s+
    return end - i;
  }
  // Unreachable: every code point is a letter, number, whitespace or "other" (rule 4).
  return 1;
}

}  // namespace

SplitPattern parse_split_pattern(const std::string& regex, const std::string& field) {
  if (regex == kQwen2) return SplitPattern::Qwen2;
  if (regex == kLlama3) return SplitPattern::Llama3;
  fail("tokenizer: {}: unsupported pre-tokenizer regex '{}'; supported: the Qwen2/Qwen2.5/Qwen3 pattern '{}' "
       "and the Llama-3 pattern '{}'",
       field, regex, kQwen2, kLlama3);
}

const char* split_pattern_regex(SplitPattern p) { return p == SplitPattern::Qwen2 ? kQwen2 : kLlama3; }

std::vector<std::pair<uint32_t, uint32_t>> pretokenize(SplitPattern p, const std::u32string& cps) {
  const int max_digits = p == SplitPattern::Qwen2 ? 1 : 3;
  std::vector<std::pair<uint32_t, uint32_t>> out;
  size_t i = 0;
  while (i < cps.size()) {
    const size_t m = match_at(cps, i, max_digits);
    out.emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(i + m));
    i += m;
  }
  return out;
}

std::vector<std::string> pretokenize_utf8(SplitPattern p, std::string_view text) {
  const std::string clean = utf8_sanitize(text);
  const Utf8Text t = utf8_decode(clean);
  std::vector<std::string> out;
  for (auto [b, e] : pretokenize(p, t.cps)) out.emplace_back(clean.substr(t.offsets[b], t.offsets[e] - t.offsets[b]));
  return out;
}

}  // namespace lt::data
