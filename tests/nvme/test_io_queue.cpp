// The NVMe tier's io_uring queue shape (nvme/io_queue.h): the rule by hand (request size from the submission cost,
// depth from the bandwidth-delay product, both bounded), its overrides and errors, and a round trip through a store
// of the rule's shape.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "../common/test_dir.h"
#include "core/error.h"
#include "nvme/io_queue.h"
#include "nvme/nvme_store.h"

namespace lt {
namespace {

constexpr int64_t KiB = 1024, MiB = 1024 * 1024;

std::string error_of(double bandwidth, double latency, unsigned depth, int64_t piece) {
  try {
    io_queue_shape(bandwidth, latency, depth, piece);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(IoQueue, RuleByHand) {
  // 3.5 GB/s, 100 us: a request of >= 3.5e9 x 20 us / 0.05 = 1.4 MB -> 2 MiB; 350 KB in flight / 2 MiB -> 1 + 1 = 2,
  // raised to the floor of 4.
  IoQueueShape s = io_queue_shape(3.5e9, 100e-6);
  EXPECT_EQ(s.piece, 2 * MiB);
  EXPECT_EQ(s.depth, 4u);
  EXPECT_EQ(s.describe(), "4 x 2.0 MiB");
  // 2 GB/s, 5 ms (a network disk): >= 0.8 MB -> 1 MiB; 10 MB in flight / 1 MiB = 9.54 -> 10 + 1 = 11.
  s = io_queue_shape(2e9, 5e-3);
  EXPECT_EQ(s.piece, 1 * MiB);
  EXPECT_EQ(s.depth, 11u);
  // 0.1 GB/s: >= 40 KB -> the floor of 256 KiB; 100 KB in flight at 1 ms -> 1 + 1, the floor of 4.
  s = io_queue_shape(1e8, 1e-3);
  EXPECT_EQ(s.piece, 256 * KiB);
  EXPECT_EQ(s.depth, 4u);
  // 20 GB/s, 100 ms: >= 8 MB -> 8 MiB (the ceiling); 2 GB in flight -> 240 requests, the ceiling of 64.
  s = io_queue_shape(2e10, 0.1);
  EXPECT_EQ(s.piece, 8 * MiB);
  EXPECT_EQ(s.depth, 64u);
}

// Below the ceiling, the requests in flight carry the bandwidth: depth x piece / (latency + piece / B) >= B.
TEST(IoQueue, DepthReachesTheBandwidth) {
  for (double b : {5e8, 1.5e9, 3.5e9, 7e9, 1.4e10})
    for (double t : {20e-6, 100e-6, 1e-3, 5e-3}) {
      const IoQueueShape s = io_queue_shape(b, t);
      if (s.depth == kMaxIoDepth) continue;
      const double p = double(s.piece);
      EXPECT_GE(s.depth * p / (t + p / b), b) << b << " B/s, " << t << " s: " << s.describe();
      // The submission cost's share (no rate here needs more than the 8 MiB ceiling).
      EXPECT_LE(kIoSubmitCost / (p / b), kIoSubmitShare + 1e-12) << s.describe();
    }
}

TEST(IoQueue, OverridesAndErrors) {
  const IoQueueShape rule = io_queue_shape(3.5e9, 100e-6);
  IoQueueShape s = io_queue_shape(3.5e9, 100e-6, 0, 0);
  EXPECT_EQ(s.depth, rule.depth);
  EXPECT_EQ(s.piece, rule.piece);
  s = io_queue_shape(3.5e9, 100e-6, 16, 512 * KiB);
  EXPECT_EQ(s.depth, 16u);
  EXPECT_EQ(s.piece, 512 * KiB);
  EXPECT_NE(error_of(3.5e9, 100e-6, 0, 1000).find("multiple of 4096 bytes up to 8388608, got 1000"), std::string::npos);
  EXPECT_NE(error_of(3.5e9, 100e-6, 65, 0).find("depth must be in [1, 64], got 65"), std::string::npos);
  EXPECT_NE(error_of(0, 100e-6, 0, 0).find("bandwidth must be > 0 bytes/s, got 0"), std::string::npos);
  EXPECT_NE(error_of(1e9, -1, 0, 0).find("latency must be >= 0 s, got -1"), std::string::npos);
}

// A store of the rule's shape writes and reads back a file of several requests and a partial one.
TEST(IoQueue, StoreOfTheRuleShapeRoundTrips) {
  lt::testing::TestDir dir("lt_io_queue_");
  IoQueueShape q = io_queue_shape(3.5e9, 100e-6, 0, 256 * KiB);  // small requests: several per file
  NvmeStore store(dir.p, default_io(q));
  const int64_t n = 5 * 256 * KiB + 4 * KiB;
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(size_t(kIoAlign), size_t(n)));
  auto* back = static_cast<uint8_t*>(std::aligned_alloc(size_t(kIoAlign), size_t(n)));
  for (int64_t i = 0; i < n; ++i) buf[i] = uint8_t(i * 7 + (i >> 12));
  store.write(3, 0, buf, n);
  std::memset(back, 0, size_t(n));
  store.read(3, 0, back, n);
  EXPECT_EQ(std::memcmp(buf, back, size_t(n)), 0);
  std::free(buf);
  std::free(back);
}

}  // namespace
}  // namespace lt
