// PCRE2 (JIT, UTF + Unicode properties) for the regexes of HF tokenizer.json files (Split patterns,
// Replace normalizers/decoders, the ByteLevel GPT-2 pattern). HF tokenizers compiles them with
// Oniguruma; translate_onig_pattern() maps the few constructs whose meaning differs between the two
// engines (\s \S \w \W \h \H, \uHHHH) so PCRE2 matches what Oniguruma matches.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lt::data {

// Oniguruma (Ruby syntax, UTF-8) pattern -> equivalent PCRE2 pattern.
std::string translate_onig_pattern(std::string_view pattern);

class Regex {
 public:
  // Compiles `pattern` (Oniguruma syntax, translated); errors name `where` and the offset.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // All non-overlapping matches, left to right, as byte ranges of `text` (valid UTF-8). Empty matches
  // are skipped (HF drops empty pieces), scanning then resumes one character further.
  void find_all(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

}  // namespace lt::data
