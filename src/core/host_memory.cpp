#include "core/host_memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace lt {

int64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

void advise_huge_pages(void* p, size_t bytes) {
#ifdef MADV_HUGEPAGE
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lo = (a + kHugePage - 1) / kHugePage * kHugePage, hi = (a + bytes) / kHugePage * kHugePage;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)p, (void)bytes;
#endif
}

void* aligned_host_alloc(size_t bytes, size_t align) {
  const size_t len = (bytes + align - 1) / align * align;
  if (bytes < kHugePageMin) return std::aligned_alloc(align, len);
  // 2 MiB aligned, not rounded up: only the whole 2 MiB pages inside get huge pages, so the tail of
  // each buffer (4 KiB pages) adds no resident memory.
  void* p = nullptr;
  if (posix_memalign(&p, kHugePage, len) != 0) return nullptr;
  advise_huge_pages(p, len);
  return p;
}

}  // namespace lt
