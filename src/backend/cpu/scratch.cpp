#include "backend/cpu/scratch.h"

#include <array>

#include "core/error.h"

namespace lt::cpu {

namespace {
constexpr size_t kAlign = 16;  // floats = 64 bytes
constexpr int kSlots = 4;
}  // namespace

Scratch& Scratch::get(int slot) {
  thread_local std::array<Scratch, kSlots> arenas;
  LT_CHECK(slot >= 0 && slot < kSlots, "Scratch slot {} out of range [0, {})", slot, kSlots);
  return arenas[size_t(slot)];
}

void Scratch::reset(int64_t n_floats, int n_takes) {
  const size_t need = size_t(n_floats) + size_t(n_takes + 1) * kAlign;
  if (need > cap_) {
    mem_ = std::make_unique_for_overwrite<float[]>(need);
    cap_ = need;
  }
  used_ = 0;
}

float* Scratch::take(int64_t n) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(mem_.get());
  size_t off = used_;
  const uintptr_t addr = base + off * sizeof(float);
  const size_t pad = ((64 - addr % 64) % 64) / sizeof(float);
  off += pad;
  LT_CHECK(off + size_t(n) <= cap_, "Scratch overflow: {} + {} floats > capacity {}", off, n, cap_);
  used_ = off + size_t(n);
  return mem_.get() + off;
}

}  // namespace lt::cpu
