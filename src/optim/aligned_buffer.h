// 64-byte aligned heap array, zero-initialised by default (optimizer states: large, never resized).
// Large ones get transparent huge pages (core/host_memory.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "core/host_memory.h"

namespace lt::optim {

template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) { reset(n); }
  AlignedBuffer(AlignedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      std::free(p_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(p_); }

  // zero = false leaves the memory untouched (the caller zeroes it, e.g. in parallel: first touch).
  void reset(size_t n, bool zero = true) {
    std::free(p_);
    p_ = nullptr;
    n_ = n;
    if (n == 0) return;
    const size_t bytes = n * sizeof(T);
    p_ = static_cast<T*>(aligned_host_alloc(bytes));
    if (!p_) throw std::bad_alloc();
    if (zero) std::memset(static_cast<void*>(p_), 0, bytes);
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace lt::optim
