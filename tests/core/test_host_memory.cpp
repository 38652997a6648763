// Host allocations for streamed buffers: alignment, usability, and the 2 MiB start of large mappings
// (which is what lets every page of a pinned buffer be a huge page).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/host_memory.h"

using namespace lt;

namespace {
uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }
}  // namespace

TEST(HostMemory, AlignedAllocAlignsAndLargeBuffersStartOnAHugePage) {
  void* small = aligned_host_alloc(1000, 64);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(addr(small) % 64, 0u);
  std::memset(small, 1, 1000);
  std::free(small);
  void* big = aligned_host_alloc(kHugePageMin + 123);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(addr(big) % kHugePage, 0u);
  std::memset(big, 2, kHugePageMin + 123);
  std::free(big);
}

TEST(HostMemory, MapsAreUsableAndLargeOnesStartOnAHugePage) {
  for (size_t bytes : {size_t(1), size_t(4096), size_t(100000), kHugePageMin, kHugePageMin + 5000, 3 * kHugePage + 1}) {
    void* p = host_map(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(addr(p) % 4096, 0u) << bytes;
    if (bytes >= kHugePageMin) {
      EXPECT_EQ(addr(p) % kHugePage, 0u) << bytes;
    }
    auto* c = static_cast<unsigned char*>(p);
    std::memset(c, 0xab, bytes);  // every byte asked for is writable
    EXPECT_EQ(c[0], 0xab);
    EXPECT_EQ(c[bytes - 1], 0xab);
    host_unmap(p, bytes);
  }
  host_unmap(nullptr, 10);  // no-op
}
