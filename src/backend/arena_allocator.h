// Offsets in one arena of a fixed size, first fit with coalescing: the placement logic of the CUDA backend's
// device arena (backend/cuda/device_arena.h, one cudaMalloc carved by it), without any memory of its own, so that
// the CPU backend models the same arena over its device budget and fails where the GPU would for the same
// sequence of allocations and releases.
//
// Two ends: long-lived buffers take the lowest free block that fits (End::Low), a buffer that is released and
// taken again at another size (the backend's workspace) the highest one, from its top (End::High). Such a buffer
// then borders the free space between the two ends instead of leaving a hole among the long-lived ones, so that
// taking it again larger finds that space in one piece.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string_view>

namespace lt {

class ArenaAllocator {
 public:
  static constexpr int64_t kAlign = 256;
  enum class End : uint8_t { Low, High };

  explicit ArenaAllocator(int64_t bytes);  // the arena: bytes rounded down to kAlign, > 0
  // The offset of a block of `bytes` (> 0, rounded up to kAlign) at `end`. Throws lt::Error "device arena
  // exhausted: '<tag>' asks <bytes>, free <bytes> (largest block <bytes>) of an arena of <bytes>".
  int64_t allocate(int64_t bytes, std::string_view tag, End end = End::Low);
  // Frees the block at `offset` and merges it with free neighbours. Throws for an offset it did not hand out.
  void release(int64_t offset);

  int64_t size() const { return size_; }
  int64_t in_use() const;  // bytes of live blocks (rounded up to kAlign)
  int64_t peak() const;    // the most in_use() has been
  int64_t largest_free() const;
  int64_t live_blocks() const;

  static int64_t round_up(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

 private:
  std::map<int64_t, int64_t>::iterator fit(int64_t want, End end);
  int64_t largest_free_locked() const;

  int64_t size_ = 0, used_ = 0, peak_ = 0;
  std::map<int64_t, int64_t> free_;  // offset -> bytes, never two adjacent
  std::map<int64_t, int64_t> live_;  // offset -> bytes
  mutable std::mutex mu_;
};

}  // namespace lt
