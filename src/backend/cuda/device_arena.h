// One big cudaMalloc carved by a first-fit allocator with coalescing (backend/arena_allocator.h, the placement
// logic the CPU backend models too): this is how --gpu-mem is a hard cap (nothing else allocates device memory
// after start-up, so the process's peak stays within the arena plus the CUDA context and the small cuBLAS handle
// state).
#pragma once
#include <cstdint>

#include "backend/arena_allocator.h"

namespace lt::cuda {

class DeviceArena {
 public:
  static constexpr int64_t kAlign = ArenaAllocator::kAlign;
  using End = ArenaAllocator::End;
  explicit DeviceArena(int64_t bytes);  // throws lt::Error with the CUDA message when cudaMalloc fails
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  // Throws lt::Error "device arena exhausted: ..." (asked, free in total, largest free block, arena size).
  // end: ArenaAllocator's (High for the workspace, which is released and taken again at other sizes).
  void* allocate(int64_t bytes, const char* tag, End end = End::Low);
  void release(void* p);
  int64_t size() const { return alloc_.size(); }
  int64_t in_use() const { return alloc_.in_use(); }
  int64_t largest_free() const { return alloc_.largest_free(); }
  int64_t peak() const { return alloc_.peak(); }

 private:
  ArenaAllocator alloc_;
  char* base_ = nullptr;
};

// Page-locked host memory: mmap'd pages registered with cudaHostRegister. On failure the error says
// how much was asked, the memlock and cgroup limits in force, and what to change.
void* pinned_alloc(int64_t bytes, int64_t already_pinned);
void pinned_free(void* p, int64_t bytes);

}  // namespace lt::cuda
