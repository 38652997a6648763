#include "core/host_memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace lt {

namespace {
int64_t meminfo_bytes(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key >> kb >> unit)
    if (key == field) return kb * 1024;
  return 0;
}
}  // namespace

int64_t mem_available_bytes() { return meminfo_bytes("MemAvailable:"); }
int64_t mem_total_bytes() { return meminfo_bytes("MemTotal:"); }

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

namespace {
size_t page_round(size_t bytes) { return (bytes + 4095) / 4096 * 4096; }
}  // namespace

void* host_map(size_t bytes) {
  const size_t len = page_round(bytes);
  const size_t slack = len >= kHugePageMin ? kHugePage : 0;
  void* m = mmap(nullptr, len + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  if (slack == 0) return m;
  // Keep the 2 MiB-aligned `len` bytes inside the larger mapping; give the head and tail back.
  const auto a = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = (a + kHugePage - 1) / kHugePage * kHugePage;
  if (start > a) munmap(m, start - a);
  if (const uintptr_t end = a + len + slack; end > start + len) munmap(reinterpret_cast<void*>(start + len), end - start - len);
  void* p = reinterpret_cast<void*>(start);
  advise_huge_pages(p, len);
  return p;
}

void host_unmap(void* p, size_t bytes) {
  if (p) munmap(p, page_round(bytes));
}

}  // namespace lt
