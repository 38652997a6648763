// The exact fp32 master in 4 B (core/model_state.h): a bf16 "high half", which is also the streaming
// copy the GPU reads, plus a signed 16-bit remainder.
//
// Why ties away from zero and not ties to even: with round-to-nearest-even, a bf16 value with an even
// mantissa is the rounding of 2^16 + 1 fp32 values (both half-way points round to it), which 16 bits
// cannot tell apart. Rounding half-way cases away from zero makes every bf16 value the image of
// exactly 2^16 consecutive fp32 bit patterns [hi - 2^15, hi + 2^15) of the magnitude, so
//     magnitude bits = (hi_magnitude << 16) + remainder,   remainder in [-2^15, 2^15)
// holds for every finite fp32, subnormals and binade crossings included (the magnitude bits of
// non-negative floats are ordered like the values). The sign is carried by hi, so -0.0 survives. The
// copy differs from round-to-nearest-even only at exact half-way points (2^-16 of the values) and by
// at most half an ulp of bf16 as before. fp32 values above bf16's largest finite round to inf as
// with RNE; the remainder still rebuilds them exactly. NaN: hi is a quiet NaN, the payload is kept
// where it fits (not guaranteed: NaN masters are never produced by a finite update).
//
// Stochastic rounding (master_weights: bf16-sr) adds 16 random bits to the magnitude and truncates:
// P(round up) = distance to the lower neighbour / ulp, so the rounding is unbiased.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace lt {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Splits x into its streaming copy *hi (round to nearest, ties away) and remainder *lo. Branch-free, so
// that loops over it vectorise.
inline void split_master(float x, bf16_t* hi, uint16_t* lo) {
  const uint32_t u = f32_bits(x), sign = u & 0x80000000u, mag = u & 0x7fffffffu;
  const uint32_t h = (mag + 0x8000u) >> 16;  // <= 0x7f80 (inf) for every finite or infinite mag
  const bool nan = mag > 0x7f800000u;
  *hi = static_cast<bf16_t>(nan ? ((u >> 16) | 0x40u) : ((sign >> 16) | h));
  *lo = static_cast<uint16_t>(nan ? u : mag - (h << 16));  // two's complement of a value in [-2^15, 2^15)
}

// Rebuilds the exact fp32 from the pair.
inline float join_master(bf16_t hi, uint16_t lo) {
  const uint32_t sign = uint32_t(hi & 0x8000u) << 16, h = hi & 0x7fffu;
  const uint32_t mag = (h << 16) + uint32_t(int32_t(int16_t(lo)));
  return bits_f32(h > 0x7f80u ? (uint32_t(hi) << 16) | lo : sign | mag);  // NaN: the bits as stored
}

// Counter-based random bits for stochastic rounding: a pure function of (seed, step, unit, element), so
// the result does not depend on the threads or chunks an update is split into. The per-(step, unit) key
// is a splitmix64 mix; the per-element bits are murmur3's 32-bit finaliser of key + element * golden
// ratio (32-bit integer arithmetic only, so the tile loops vectorise). Elements are offsets inside a
// unit (< 2^32).
inline uint32_t sr_key(uint64_t seed, uint64_t step, uint64_t unit) {
  uint64_t z = seed ^ (step * 0x9e3779b97f4a7c15ull) ^ (unit * 0xd1b54a32d192ed03ull);
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<uint32_t>(z);
}
inline uint32_t sr_bits(uint32_t key, uint32_t element) {
  uint32_t h = key + element * 0x9e3779b9u;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

// x rounded to bf16 stochastically with the low 16 bits of r (NaN stays NaN; values that would round
// past the largest finite bf16 become inf, as in round-to-nearest).
inline bf16_t round_bf16_sr(float x, uint32_t r) {
  const uint32_t u = f32_bits(x), sign = u & 0x80000000u, mag = u & 0x7fffffffu;
  const uint32_t m = (mag + (r & 0xffffu)) >> 16;  // past the largest finite: 0x7f80, inf
  const bool special = mag >= 0x7f800000u;          // inf, NaN: as round-to-nearest
  return static_cast<bf16_t>(special ? ((u >> 16) | (mag > 0x7f800000u ? 0x40u : 0u)) : ((sign >> 16) | m));
}

}  // namespace lt
