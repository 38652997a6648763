// Element types and bf16 conversion (round to nearest even, as PyTorch does).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace lt {

enum class DType { F32, BF16, F16, U8, I32, I64 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: return 2;
    case DType::U8: return 1;
    case DType::I64: return 8;
  }
  return 0;
}
const char* dtype_name(DType t);  // "F32", "BF16", ... (safetensors spelling)

using bf16_t = uint16_t;

inline bf16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16_t>(u >> 16);
}
inline float bf16_to_f32(bf16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Gradient accumulation into bf16: acc[i] = f32_to_bf16(bf16_to_f32(acc[i]) + g[i]) for i < n, in element order (a
// zero acc gives each g[i] rounded to nearest-even). Returns the sum of squares of the stored values, in fp64, in
// element order. The CPU backend's Backend::grad_add with a bf16 accumulator (held bf16 gradients) and the host's
// bf16 gradient of a host-looked-up embedding both run this, so the two round alike bit for bit.
inline double add_into_bf16(bf16_t* acc, const float* g, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    acc[i] = f32_to_bf16(bf16_to_f32(acc[i]) + g[i]);
    const double v = bf16_to_f32(acc[i]);
    s += v * v;
  }
  return s;
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace lt
