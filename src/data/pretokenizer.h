// The Split pre-tokenizer regexes of the Qwen2/Qwen2.5/Qwen3 and Llama-3 tokenizers, implemented as
// a hand-written matcher with the regex's exact semantics (ordered alternation, greedy quantifiers,
// backtracking, the \s+(?!\S) lookahead), so no regex engine is needed. The patterns are:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,K}| ?[^\s\p{L}\p{N}]+[\r\n]*
//   |\s*[\r\n]+|\s+(?!\S)|\s+
// with K = 1 (Qwen2 family: digits are split one by one) or K = 3 (Llama-3).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/unicode.h"

namespace lt::data {

enum class SplitPattern { Qwen2, Llama3 };

// Recognises one of the supported regexes (as written in tokenizer.json); throws lt::Error naming
// `field` and the supported families otherwise.
SplitPattern parse_split_pattern(const std::string& regex, const std::string& field);
const char* split_pattern_regex(SplitPattern p);

// Splits text (already decoded) into pieces; returns [begin, end) code-point index ranges that
// cover the text exactly, in order ("Isolated" behaviour).
std::vector<std::pair<uint32_t, uint32_t>> pretokenize(SplitPattern p, const std::u32string& cps);

// Convenience: split UTF-8 text into UTF-8 pieces.
std::vector<std::string> pretokenize_utf8(SplitPattern p, std::string_view text);

}  // namespace lt::data
