// The split master's join and split (core/split_master.h's bit operations) on the device: the fp32 master as its bf16
// high half plus a 16-bit remainder. Shared by the device AdamW steps (adamw_step.cu, adamw_step_q8.cu).
#pragma once
#include <cstdint>

namespace lt::cuda {

__device__ __forceinline__ float join_master(uint16_t hi, uint16_t lo) {
  const uint32_t sign = uint32_t(hi & 0x8000u) << 16, h = hi & 0x7fffu;
  const uint32_t mag = (h << 16) + uint32_t(int32_t(int16_t(lo)));
  return __uint_as_float(h > 0x7f80u ? (uint32_t(hi) << 16) | lo : sign | mag);
}

__device__ __forceinline__ void split_master(float x, uint16_t* hi, uint16_t* lo) {
  const uint32_t u = __float_as_uint(x), sign = u & 0x80000000u, mag = u & 0x7fffffffu;
  const uint32_t h = (mag + 0x8000u) >> 16;
  const bool nan = mag > 0x7f800000u;
  *hi = uint16_t(nan ? ((u >> 16) | 0x40u) : ((sign >> 16) | h));
  *lo = uint16_t(nan ? u : mag - (h << 16));
}

}  // namespace lt::cuda
