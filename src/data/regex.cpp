#include "data/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>


#include "core/error.h"

namespace lt::data {

namespace {
// Oniguruma's \s is the White_Space property (PCRE2's UCP \s also takes U+180E); \w is Alphabetic,
// marks, decimal digits, connector punctuation and the joiners (PCRE2's UCP \w is L, N and _);
// \h is a hex digit in Ruby syntax (horizontal space in PCRE2).
constexpr const char* kSpace = "\\p{White_Space}";
constexpr const char* kWordInner = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}";
constexpr const char* kHexInner = "0-9a-fA-F";
}  // namespace

std::string translate_onig_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  int class_depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      const bool in = class_depth > 0;
      switch (n) {
        case 's': out += kSpace; ++i; continue;
        case 'S': out += "\\P{White_Space}"; ++i; continue;
        case 'w': out += in ? std::string(kWordInner) : "[" + std::string(kWordInner) + "]"; ++i; continue;
        case 'W':
          LT_CHECK(!in, "regex: \\W inside a character class is not supported: {}", std::string(p));
          out += "[^" + std::string(kWordInner) + "]"; ++i; continue;
        case 'h': out += in ? std::string(kHexInner) : "[" + std::string(kHexInner) + "]"; ++i; continue;
        case 'H':
          LT_CHECK(!in, "regex: \\H inside a character class is not supported: {}", std::string(p));
          out += "[^" + std::string(kHexInner) + "]"; ++i; continue;
        case 'u':
          if (i + 6 <= p.size()) {
            const std::string_view hex = p.substr(i + 2, 4);
            bool ok = hex.size() == 4;
            for (char h : hex) ok = ok && std::isxdigit(static_cast<unsigned char>(h));
            if (ok) {
              out += "\\x{" + std::string(hex) + "}";
              i += 5;
              continue;
            }
          }
          break;
        default: break;
      }
      out += c;
      out += n;
      ++i;
      continue;
    }
    if (c == '[') {
      ++class_depth;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') { out += '^'; ++i; }
      if (i + 1 < p.size() && p[i + 1] == ']') { out += "\\]"; ++i; }
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
  }
  return out;
}

namespace {
// Match data with one ovector pair (the whole match is all find_all reads; a pattern's capture groups
// then make pcre2 return 0, "ovector too small", with the match still in pair 0). One per thread,
// shared by every pattern: threads matching at once take no lock.
struct ThreadMatchData {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  ~ThreadMatchData() { pcre2_match_data_free(md); }
};
pcre2_match_data* thread_match_data() {
  thread_local ThreadMatchData t;
  LT_CHECK(t.md, "regex: out of memory for match data");
  return t.md;
}
}  // namespace

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

Regex::Regex(const std::string& pattern, const std::string& where) : impl_(std::make_unique<Impl>()), pattern_(pattern) {
  const std::string pc = translate_onig_pattern(pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pc.data()), pc.size(), PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK,
                              &err, &off, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("{}: invalid regex at offset {}: {} (pattern: {})", where, static_cast<size_t>(off),
         reinterpret_cast<const char*>(msg), pattern);
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;

void Regex::find_all(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& out) const {
  pcre2_match_data* md = thread_match_data();
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    const int rc = impl_->jit ? pcre2_jit_match(impl_->code, subj, text.size(), pos, 0, md, nullptr)
                              : pcre2_match(impl_->code, subj, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("regex '{}': match failed: {}", pattern_, reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(static_cast<uint32_t>(b), static_cast<uint32_t>(e));
      pos = e;
    } else {  // empty match: advance one UTF-8 character
      pos = b + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
}

}  // namespace lt::data
