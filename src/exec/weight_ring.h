// Ring of k device buffers through which decoder-layer weights stream. The sequence of layer uses
// of a step (forward, then per block recompute and backward) is known in advance, so slots are
// assigned statically: a use whose layer is still in a slot reuses it (no transfer); otherwise the
// slot whose content is needed again farthest in the future is overwritten (Belady), among the slots
// not used by the previous k-1 uses, so that every load can be issued k-1 uses ahead of its compute
// (prefetch on the H2D lane) as soon as the slot's previous content is no longer needed.
#pragma once
#include <cstdint>
#include <vector>

namespace lt {

struct RingSchedule {
  std::vector<int64_t> layer;        // per use
  std::vector<int32_t> window;       // per use
  std::vector<int32_t> slot;         // per use
  std::vector<char> load;            // per use: needs an H2D
  std::vector<int64_t> evict_after;  // per loading use: last use of the slot's previous content, or -1
  std::vector<int64_t> loader;       // per use: the loading use whose data it reads
  int64_t loads() const;
};

RingSchedule build_ring_schedule(const std::vector<int64_t>& layers, const std::vector<int32_t>& windows, int ring);

}  // namespace lt
