// Exact-match scoring with MetaMathQA's convention: the answer follows the last
// "The answer is:" in the response. Numeric answers are normalised before comparison, so
// "85", "85.0", "+85", "85." and "1,085" vs "1085" compare equal; other answers compare as
// trimmed text with surrounding "$" and a trailing period removed.
#pragma once
#include <optional>
#include <string>

namespace lt::train {

// Text after the last "The answer is" marker (":" optional), up to the end of that line, trimmed.
// nullopt when the marker is absent.
std::optional<std::string> extract_answer(const std::string& text);

// Canonical form used for comparison: numbers in canonical decimal form (no sign for zero,
// no leading zeros, no trailing fractional zeros, no thousands separators); other text trimmed.
std::string normalize_answer(const std::string& answer);

// True when both answers normalise to the same string.
bool answers_match(const std::string& predicted, const std::string& reference);

// Scores a generated response against the reference response (or a bare reference answer):
// the reference's answer is extracted if it contains the marker, else used as is.
bool exact_match(const std::string& generated, const std::string& reference);

}  // namespace lt::train
