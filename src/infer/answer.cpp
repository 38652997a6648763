#include "infer/answer.h"

#include <algorithm>
#include <cctype>

namespace lt::train {
namespace {

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// Canonical decimal string if `s` is a plain decimal number (optional sign, digits with optional
// "," thousands groups, optional fraction), else nullopt.
std::optional<std::string> canonical_number(const std::string& s) {
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  std::string intpart, frac;
  bool any_digit = false, seen_dot = false;
  for (; i < s.size(); ++i) {
    char ch = s[i];
    if (std::isdigit(static_cast<unsigned char>(ch))) {
      (seen_dot ? frac : intpart) += ch;
      any_digit = true;
    } else if (ch == ',' && !seen_dot && !intpart.empty()) {
      // thousands separator: exactly three digits must follow before the next separator or dot
      size_t j = i + 1, n = 0;
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j, ++n;
      if (n != 3) return std::nullopt;
    } else if (ch == '.' && !seen_dot) {
      seen_dot = true;
    } else {
      return std::nullopt;
    }
  }
  if (!any_digit) return std::nullopt;
  intpart.erase(0, std::min(intpart.find_first_not_of('0'), intpart.size()));
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  if (intpart.empty()) intpart.assign(1, '0');  // not = "0": GCC 12 warns falsely there (-Wrestrict, PR 105329)
  std::string out = intpart;
  if (!frac.empty()) out += "." + frac;
  if (neg && out != "0") out = "-" + out;
  return out;
}

}  // namespace

std::optional<std::string> extract_answer(const std::string& text) {
  static const std::string marker = "the answer is";
  std::string low = lower(text);
  size_t pos = low.rfind(marker);
  if (pos == std::string::npos) return std::nullopt;
  size_t start = pos + marker.size();
  if (start < text.size() && text[start] == ':') ++start;
  size_t end = text.find('\n', start);
  return trim(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
}

std::string normalize_answer(const std::string& answer) {
  std::string s = trim(answer);
  // Strip wrappers that do not change the value: "$...$", "\boxed{...}", a trailing period.
  if (s.size() >= 2 && s.front() == '$' && s.back() == '$') s = trim(s.substr(1, s.size() - 2));
  if (s.rfind("\\boxed{", 0) == 0 && !s.empty() && s.back() == '}') s = trim(s.substr(7, s.size() - 8));
  if (!s.empty() && s.front() == '$') s = trim(s.substr(1));  // currency sign
  // A trailing period ends the sentence unless it is the only thing (numbers like "85." keep
  // their value either way since canonical_number accepts a bare trailing dot).
  if (auto num = canonical_number(s)) return *num;
  if (s.size() > 1 && s.back() == '.') s = trim(s.substr(0, s.size() - 1));
  if (auto num = canonical_number(s)) return *num;
  return s;
}

bool answers_match(const std::string& predicted, const std::string& reference) {
  return normalize_answer(predicted) == normalize_answer(reference);
}

bool exact_match(const std::string& generated, const std::string& reference) {
  auto pred = extract_answer(generated);
  if (!pred) return false;
  auto ref = extract_answer(reference);
  return answers_match(*pred, ref ? *ref : reference);
}

}  // namespace lt::train
