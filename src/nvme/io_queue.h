// The shape of the NVMe tier's io_uring queue (nvme_store.h, UringIo): the bytes of one request (`piece`) and the
// requests kept in flight (`depth`), from the disk's bandwidth and its per-request latency.
//
// Rule (Little's law). A request of p bytes spends the access latency t at the disk before its data moves at the
// disk's rate B, so d requests in flight carry d * p / (t + p / B) bytes/s. Reaching B takes d >= B * t / p + 1:
// the bandwidth-delay product B * t in flight beyond the request being transferred. Hence
//   depth = ceil(B * t / p) + 1, bounded to [kMinIoDepth, kMaxIoDepth] (the floor: see kMinIoDepth);
//   piece = the smallest power of two >= B * kIoSubmitCost / kIoSubmitShare, bounded to [kMinIoPiece, kMaxIoPiece]:
//           the submitting thread's own cost per request (prepare, submit, reap) stays under kIoSubmitShare of the
//           request's transfer time.
// The profile's nvme_read_gbps / nvme_write_gbps give B (the larger of the two: one queue does both), its
// nvme_latency_us t (`lazytrain profile` measures it: plan/profile.h measure_nvme; a profile without it:
// kDefaultIoLatency); nvme_queue_depth and nvme_request_kib, when set, replace the rule's figures.
#pragma once
#include <cstdint>
#include <string>

namespace lt {

// The thread reaps and resubmits one request at a time (30-50 us of its CPU per 1 MiB request measured here, more
// while the optimizer's threads hold the cores): 3 requests queued behind the one in transfer keep one late
// resubmission from idling the disk. Depth costs no memory (the pieces are the caller's buffer), only SQ entries.
constexpr unsigned kMinIoDepth = 4;
constexpr unsigned kMaxIoDepth = 64;          // SQ entries
constexpr int64_t kMinIoPiece = 256 << 10;    // 256 KiB
constexpr int64_t kMaxIoPiece = 8 << 20;      // 8 MiB
constexpr double kIoSubmitCost = 20e-6;       // s of the thread's CPU per request besides the bytes (bench_nvme_io:
                                              // ~20 us at 256 KiB, +18-28 us per further MiB, on this 2-core VM)
constexpr double kIoSubmitShare = 0.05;       // at most this share of a request's transfer time
constexpr double kDefaultIoLatency = 100e-6;  // s: a 4 KiB read of a desktop NVMe SSD at depth 1 (here: 61 us)

struct IoQueueShape {
  unsigned depth = 8;
  int64_t piece = 1 << 20;
  std::string describe() const;  // "8 x 1 MiB"
};

// The rule's shape for bandwidth B (bytes/s, > 0) and latency t (s, >= 0); errors name the value and the expected range.
IoQueueShape io_queue_shape(double bandwidth, double latency);
// The rule's shape with overrides: depth > 0 and piece_bytes > 0 (a multiple of 4 KiB) replace its figures.
IoQueueShape io_queue_shape(double bandwidth, double latency, unsigned depth, int64_t piece_bytes);

}  // namespace lt
