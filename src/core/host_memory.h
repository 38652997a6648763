// Host memory facts from /proc, and transparent huge pages for large streamed buffers.
#pragma once
#include <cstddef>
#include <cstdint>

namespace lt {

// MemAvailable from /proc/meminfo in bytes; 0 when it cannot be read.
int64_t mem_available_bytes();
// MemTotal from /proc/meminfo in bytes (the machine's physical memory); 0 when it cannot be read.
int64_t mem_total_bytes();

// Buffers that the optimizer and the transfers stream through (masters, gradients, states, bf16
// copies) are hundreds of MiB; with 4 KiB pages every 4 KiB of each stream costs a TLB walk and restarts
// the hardware prefetcher. kHugePage-aligned allocations of at least kHugePageMin get 2 MiB pages
// where the kernel allows them (transparent huge pages in "madvise" or "always" mode).
constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kHugePageMin = size_t(4) << 20;
// madvise(MADV_HUGEPAGE) on the whole 2 MiB pages inside [p, p + bytes); best effort (errors ignored).
void advise_huge_pages(void* p, size_t bytes);
// `align`-aligned heap memory (a power of two, default 64; from kHugePageMin up: kHugePage-aligned, its
// whole 2 MiB pages advised), or null. Free with std::free.
void* aligned_host_alloc(size_t bytes, size_t align = 64);
// Anonymous private mapping of `bytes` rounded up to 4 KiB, or null. From kHugePageMin up it starts on a
// 2 MiB boundary and its whole 2 MiB pages are advised (for buffers that cudaHostRegister pins: a
// plain mmap is only 4 KiB-aligned and would lose up to one huge page at each end). Release with
// host_unmap(p, bytes).
void* host_map(size_t bytes);
void host_unmap(void* p, size_t bytes);

}  // namespace lt
