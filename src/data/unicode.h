// UTF-8 decoding/encoding and the Unicode classes the pre-tokenizer patterns use (ICU-backed).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lt::data {

// Decodes UTF-8 into code points; invalid sequences become U+FFFD (one per maximal invalid subpart,
// the same policy as Rust's String::from_utf8_lossy). offsets[i] is the byte offset of cps[i] in the
// *sanitized* string (see utf8_sanitize); offsets has one extra entry: the total length.
struct Utf8Text {
  std::u32string cps;
  std::vector<uint32_t> offsets;
};
Utf8Text utf8_decode(std::string_view s);
// Replaces invalid UTF-8 with U+FFFD (lossy).
std::string utf8_sanitize(std::string_view s);
bool utf8_valid(std::string_view s);
void utf8_append(std::string& out, char32_t cp);

// Unicode classes as Oniguruma (HF tokenizers' regex engine) defines them.
bool is_letter(char32_t cp);      // \p{L}: general category Lu Ll Lt Lm Lo
bool is_number(char32_t cp);      // \p{N}: Nd Nl No
bool is_whitespace(char32_t cp);  // \s: the White_Space property

// Unicode NFC normalisation of UTF-8 text (ICU).
std::string nfc(std::string_view s);
// NFC, NFD, NFKC or NFKD (ICU).
std::string unicode_normalize(std::string_view s, const std::string& form);
// Decodes the code point at s[i] of valid UTF-8 (U+FFFD, length 1 for an invalid byte); returns its length.
int utf8_next(std::string_view s, size_t i, char32_t& cp);

}  // namespace lt::data
