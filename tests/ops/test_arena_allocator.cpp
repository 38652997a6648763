// The device arena's placement (ArenaAllocator: first fit, coalescing, the two ends, the exhausted message) and
// its model on the CPU backend: a device budget there is an arena of that size, which fails where the GPU's would.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "backend/arena_allocator.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace lt {
namespace {

constexpr int64_t K = 1024;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ArenaAllocator, FirstFitReusesTheLowestHoleThatFits) {
  ArenaAllocator a(16 * K);
  const int64_t x = a.allocate(2 * K, "x"), y = a.allocate(1 * K, "y"), z = a.allocate(2 * K, "z");
  EXPECT_EQ(x, 0);
  EXPECT_EQ(y, 2 * K);
  EXPECT_EQ(z, 3 * K);
  a.release(x);                                  // a 2 KiB hole at 0, 11 KiB free after z
  EXPECT_EQ(a.allocate(3 * K, "big"), 5 * K);    // does not fit the hole: after z
  EXPECT_EQ(a.allocate(1 * K, "small"), 0);      // the lowest block that fits: the hole
  EXPECT_EQ(a.allocate(1 * K, "small2"), 1 * K); // the rest of the hole
  EXPECT_EQ(a.in_use(), 8 * K);
  EXPECT_EQ(a.largest_free(), 8 * K);
}

TEST(ArenaAllocator, RoundsToTheAlignment) {
  ArenaAllocator a(4 * K + 100);
  EXPECT_EQ(a.size(), 4 * K);  // rounded down
  const int64_t x = a.allocate(1, "x"), y = a.allocate(257, "y"), z = a.allocate(256, "z");
  EXPECT_EQ(x, 0);
  EXPECT_EQ(y, 256);
  EXPECT_EQ(z, 768);
  EXPECT_EQ(a.in_use(), 1024);
  EXPECT_EQ(a.live_blocks(), 3);
}

TEST(ArenaAllocator, ReleaseCoalescesWithBothNeighbours) {
  ArenaAllocator a(8 * K);
  std::vector<int64_t> b;
  for (int i = 0; i < 8; ++i) b.push_back(a.allocate(K, "b"));
  a.release(b[1]);
  a.release(b[3]);
  EXPECT_EQ(a.largest_free(), K);
  a.release(b[2]);  // joins b[1] and b[3]
  EXPECT_EQ(a.largest_free(), 3 * K);
  EXPECT_EQ(a.allocate(3 * K, "joined"), b[1]);
  for (int i : {0, 1, 2, 3, 4, 5, 6, 7})
    if (i < 1 || i > 3) a.release(b[size_t(i)]);
  a.release(b[1]);
  EXPECT_EQ(a.in_use(), 0);
  EXPECT_EQ(a.largest_free(), 8 * K);
  EXPECT_EQ(a.peak(), 8 * K);
  EXPECT_EQ(a.live_blocks(), 0);
}

TEST(ArenaAllocator, HighEndKeepsARegrownBufferBesideTheFreeSpace) {
  ArenaAllocator a(16 * K);
  const int64_t ws = a.allocate(2 * K, "workspace", ArenaAllocator::End::High);
  EXPECT_EQ(ws, 14 * K);  // the top of the arena
  const int64_t x = a.allocate(4 * K, "x"), y = a.allocate(4 * K, "y");
  EXPECT_EQ(x, 0);
  EXPECT_EQ(y, 4 * K);
  // Released and taken again larger: the old block and the free middle are one block.
  a.release(ws);
  EXPECT_EQ(a.allocate(8 * K, "workspace", ArenaAllocator::End::High), 8 * K);
  EXPECT_EQ(a.largest_free(), 0);
  // The same sequence with the workspace at the low end, between the others: its hole and the free tail are split.
  ArenaAllocator b(16 * K);
  const int64_t ws_low = b.allocate(2 * K, "workspace");
  b.allocate(4 * K, "x");
  b.allocate(4 * K, "y");
  b.release(ws_low);
  EXPECT_NE(error_of([&] { b.allocate(8 * K, "workspace"); }), "");
}

TEST(ArenaAllocator, ExhaustedNamesTagAskedFreeAndLargestBlock) {
  ArenaAllocator a(8 * K);
  std::vector<int64_t> b;
  for (int i = 0; i < 4; ++i) b.push_back(a.allocate(2 * K, "b"));
  a.release(b[0]);
  a.release(b[2]);  // 4 KiB free in two 2 KiB blocks
  EXPECT_EQ(error_of([&] { a.allocate(3 * K - 10, "workspace"); }),
            "device arena exhausted: 'workspace' asks 3.0 KiB, free 4.0 KiB (largest block 2.0 KiB) of an arena of "
            "8.0 KiB");
  EXPECT_EQ(a.in_use(), 4 * K) << "a refused allocation takes nothing";
  EXPECT_NE(error_of([&] { a.release(K); }).find("did not allocate"), std::string::npos);
  EXPECT_NE(error_of([&] { a.allocate(0, "zero"); }).find("expected > 0"), std::string::npos);
}

// The CPU backend with a device budget: the budget's totals fit, the arena of its size does not.
TEST(CpuArenaModel, FailsWhereTheGpuArenaWould) {
  ModelConfig c;
  c.hidden = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.head_dim = 8, c.ffn = 48, c.vocab = 61;
  CpuBackendOptions o;
  o.device_budget = 8 * K;
  o.threads = 1;
  CpuBackend be(c, o);
  ASSERT_NE(be.device_arena(), nullptr);
  std::vector<Allocation> b;
  for (int i = 0; i < 4; ++i) b.push_back(be.alloc(MemKind::Device, 2 * K, "b"));
  be.free(b[0]);
  be.free(b[2]);
  EXPECT_EQ(error_of([&] { be.alloc(MemKind::Device, 3 * K, "big"); }),
            "device arena exhausted: 'big' asks 3.0 KiB, free 4.0 KiB (largest block 2.0 KiB) of an arena of 8.0 KiB");
  EXPECT_EQ(be.memory().current(MemKind::Device), 4 * K) << "the refused allocation is not counted";
  Allocation fits = be.alloc(MemKind::Device, 2 * K, "fits");  // the lowest hole
  be.free(fits);
  be.free(b[1]);
  be.free(b[3]);
  EXPECT_EQ(be.device_arena()->in_use(), 0);
  EXPECT_EQ(be.memory().current(MemKind::Device), 0);
  // Without a device budget there is no arena to model.
  CpuBackend unlimited(c, CpuBackendOptions{});
  EXPECT_EQ(unlimited.device_arena(), nullptr);
}

}  // namespace
}  // namespace lt
