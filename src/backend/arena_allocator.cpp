#include "backend/arena_allocator.h"

#include <algorithm>
#include <iterator>

#include "core/error.h"
#include "core/units.h"

namespace lt {

ArenaAllocator::ArenaAllocator(int64_t bytes) {
  size_ = bytes / kAlign * kAlign;
  LT_CHECK(size_ > 0, "device arena: size must be at least {} bytes, got {}", kAlign, bytes);
  free_[0] = size_;
}

// Low: the free block of the lowest offset that holds `want`; High: the one of the highest offset.
std::map<int64_t, int64_t>::iterator ArenaAllocator::fit(int64_t want, End end) {
  if (end == End::Low) {
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second >= want) return it;
    return free_.end();
  }
  for (auto it = free_.rbegin(); it != free_.rend(); ++it)
    if (it->second >= want) return std::prev(it.base());
  return free_.end();
}

int64_t ArenaAllocator::allocate(int64_t bytes, std::string_view tag, End end) {
  LT_CHECK(bytes > 0, "device arena: allocation of {} bytes for '{}' (expected > 0)", bytes, tag);
  const int64_t want = round_up(bytes);
  std::lock_guard<std::mutex> g(mu_);
  const auto it = fit(want, end);
  if (it == free_.end())
    fail("device arena exhausted: '{}' asks {}, free {} (largest block {}) of an arena of {}", tag,
         format_bytes(double(want)), format_bytes(double(size_ - used_)), format_bytes(double(largest_free_locked())),
         format_bytes(double(size_)));
  const int64_t block = it->first, len = it->second, rest = len - want;
  free_.erase(it);
  // Low takes the block's start and leaves its end free; High the other way round.
  const int64_t off = end == End::Low ? block : block + rest;
  if (rest > 0) free_[end == End::Low ? block + want : block] = rest;
  live_[off] = want;
  used_ += want;
  peak_ = std::max(peak_, used_);
  return off;
}

void ArenaAllocator::release(int64_t offset) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = live_.find(offset);
  LT_CHECK(it != live_.end(), "device arena: release of a block it did not allocate (offset {})", offset);
  int64_t start = offset, len = it->second;
  used_ -= len;
  live_.erase(it);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + len) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = len;
}

int64_t ArenaAllocator::in_use() const {
  std::lock_guard<std::mutex> g(mu_);
  return used_;
}

int64_t ArenaAllocator::peak() const {
  std::lock_guard<std::mutex> g(mu_);
  return peak_;
}

int64_t ArenaAllocator::largest_free() const {
  std::lock_guard<std::mutex> g(mu_);
  return largest_free_locked();
}

int64_t ArenaAllocator::live_blocks() const {
  std::lock_guard<std::mutex> g(mu_);
  return int64_t(live_.size());
}

int64_t ArenaAllocator::largest_free_locked() const {
  int64_t largest = 0;
  for (const auto& [off, len] : free_) largest = std::max(largest, len);
  return largest;
}

}  // namespace lt
