#include "nvme/io_queue.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/units.h"
#include "nvme/nvme_store.h"

namespace lt {

namespace {

// The smallest power of two >= x, bounded to [lo, hi].
int64_t pow2_at_least(double x, int64_t lo, int64_t hi) {
  int64_t p = lo;
  while (p < hi && double(p) < x) p *= 2;
  return std::min(p, hi);
}

}  // namespace

std::string IoQueueShape::describe() const { return fmt::format("{} x {}", depth, format_bytes(double(piece))); }

IoQueueShape io_queue_shape(double bandwidth, double latency) {
  LT_CHECK(bandwidth > 0 && std::isfinite(bandwidth), "NVMe queue: bandwidth must be > 0 bytes/s, got {}", bandwidth);
  LT_CHECK(latency >= 0 && std::isfinite(latency), "NVMe queue: latency must be >= 0 s, got {}", latency);
  IoQueueShape s;
  s.piece = pow2_at_least(bandwidth * kIoSubmitCost / kIoSubmitShare, kMinIoPiece, kMaxIoPiece);
  const double in_flight = std::ceil(bandwidth * latency / double(s.piece)) + 1;
  s.depth = unsigned(std::clamp(in_flight, double(kMinIoDepth), double(kMaxIoDepth)));
  return s;
}

IoQueueShape io_queue_shape(double bandwidth, double latency, unsigned depth, int64_t piece_bytes) {
  IoQueueShape s = io_queue_shape(bandwidth, latency);
  LT_CHECK(depth <= kMaxIoDepth, "NVMe queue: depth must be in [1, {}], got {}", kMaxIoDepth, depth);
  LT_CHECK(piece_bytes >= 0 && piece_bytes % kIoAlign == 0 && piece_bytes <= kMaxIoPiece,
           "NVMe queue: the request size must be a multiple of {} bytes up to {}, got {}", kIoAlign, kMaxIoPiece,
           piece_bytes);
  if (depth > 0) s.depth = depth;
  if (piece_bytes > 0) s.piece = piece_bytes;
  return s;
}

}  // namespace lt
