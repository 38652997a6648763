#include "core/units.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace lt {

int64_t parse_bytes(const std::string& text) {
  const char* s = text.c_str();
  char* end = nullptr;
  double v = std::strtod(s, &end);
  LT_CHECK(end != s && std::isfinite(v) && v >= 0, "invalid byte size '{}': expected a number with an optional unit like 24GiB", text);
  std::string unit;
  for (const char* p = end; *p; ++p)
    if (!std::isspace(static_cast<unsigned char>(*p))) unit += static_cast<char>(std::toupper(static_cast<unsigned char>(*p)));
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mult = double(KiB);
  else if (unit == "M" || unit == "MB" || unit == "MIB") mult = double(MiB);
  else if (unit == "G" || unit == "GB" || unit == "GIB") mult = double(GiB);
  else if (unit == "T" || unit == "TB" || unit == "TIB") mult = double(GiB) * 1024;
  else fail("invalid byte unit '{}' in '{}': expected B, KiB, MiB, GiB or TiB", unit, text);
  return static_cast<int64_t>(std::llround(v * mult));
}

std::string format_bytes(double bytes) {
  double a = std::fabs(bytes);
  if (a >= double(GiB)) return fmt::format("{:.2f} GiB", bytes / double(GiB));
  if (a >= double(MiB)) return fmt::format("{:.1f} MiB", bytes / double(MiB));
  if (a >= double(KiB)) return fmt::format("{:.1f} KiB", bytes / double(KiB));
  return fmt::format("{:.0f} B", bytes);
}

}  // namespace lt
