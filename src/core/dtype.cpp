#include "core/dtype.h"

#include <cmath>

namespace lt {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::U8: return "U8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  return "?";
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(float(man), -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(float(man | 0x400), int(exp) - 25);
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  if (std::isnan(f)) return uint16_t(sign | 0x7e00);
  float a = std::fabs(f);
  if (a >= 65520.0f) return uint16_t(sign | 0x7c00);
  if (a < 6.103515625e-05f) {  // subnormal: round to nearest multiple of 2^-24
    return uint16_t(sign | uint32_t(std::nearbyint(a * 16777216.0f)));
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5,1)
  uint32_t mant = uint32_t(std::nearbyint((m * 2 - 1) * 1024));
  int exp = e - 1 + 15;
  if (mant == 1024) { mant = 0; ++exp; }
  if (exp >= 31) return uint16_t(sign | 0x7c00);
  return uint16_t(sign | (uint32_t(exp) << 10) | mant);
}

}  // namespace lt
