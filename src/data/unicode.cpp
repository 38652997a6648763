#include "data/unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "core/error.h"

namespace lt::data {

namespace {
// Decodes one code point at s[i]; returns its length, or 0 for an invalid lead/sequence, in which case
// `bad` is the length of the maximal invalid subpart to replace with one U+FFFD.
int decode_one(std::string_view s, size_t i, char32_t& cp, int& bad) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  bad = 1;
  if (b0 < 0x80) { cp = b0; return 1; }
  int len;
  char32_t c;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) { len = 2; c = b0 & 0x1F; }
  else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3; c = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4; c = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) { bad = k; return 0; }
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) { bad = k; return 0; }
    lo = 0x80; hi = 0xBF;
    c = (c << 6) | (b & 0x3F);
  }
  cp = c;
  return len;
}
}  // namespace

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

Utf8Text utf8_decode(std::string_view s) {
  Utf8Text t;
  t.cps.reserve(s.size());
  t.offsets.reserve(s.size() + 1);
  uint32_t out_off = 0;
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    int bad;
    const int n = decode_one(s, i, cp, bad);
    t.offsets.push_back(out_off);
    if (n > 0) {
      t.cps.push_back(cp);
      i += n;
      out_off += n;
    } else {
      t.cps.push_back(0xFFFD);
      i += bad;
      out_off += 3;
    }
  }
  t.offsets.push_back(out_off);
  return t;
}

bool utf8_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    int bad;
    const int n = decode_one(s, i, cp, bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_sanitize(std::string_view s) {
  if (utf8_valid(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    int bad;
    const int n = decode_one(s, i, cp, bad);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      utf8_append(out, 0xFFFD);
      i += bad;
    }
  }
  return out;
}

bool is_letter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_L_MASK) != 0;
}

bool is_number(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_N_MASK) != 0;
}

bool is_whitespace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return u_isUWhiteSpace(static_cast<UChar32>(cp));
}

int utf8_next(std::string_view s, size_t i, char32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  int bad;
  const int n = decode_one(s, i, cp, bad);
  if (n > 0) return n;
  cp = 0xFFFD;
  return bad;
}

std::string nfc(std::string_view s) { return unicode_normalize(s, "NFC"); }

std::string unicode_normalize(std::string_view s, const std::string& form) {
  // Fast path: pure ASCII is invariant under all four forms.
  bool ascii = true;
  for (unsigned char c : s) {
    if (c >= 0x80) { ascii = false; break; }
  }
  if (ascii) return std::string(s);
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = form == "NFC"    ? icu::Normalizer2::getNFCInstance(err)
                              : form == "NFD"  ? icu::Normalizer2::getNFDInstance(err)
                              : form == "NFKC" ? icu::Normalizer2::getNFKCInstance(err)
                                               : icu::Normalizer2::getNFKDInstance(err);
  LT_CHECK(U_SUCCESS(err), "tokenizer: ICU {} normalizer unavailable: {}", form, u_errorName(err));
  const std::string in = utf8_sanitize(s);
  const auto us = icu::UnicodeString::fromUTF8(icu::StringPiece(in.data(), static_cast<int32_t>(in.size())));
  if (n->isNormalized(us, err) && U_SUCCESS(err)) return in;
  err = U_ZERO_ERROR;
  icu::UnicodeString out = n->normalize(us, err);
  LT_CHECK(U_SUCCESS(err), "tokenizer: {} normalisation failed: {}", form, u_errorName(err));
  std::string r;
  out.toUTF8String(r);
  return r;
}

}  // namespace lt::data
