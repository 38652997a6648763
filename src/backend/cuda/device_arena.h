// One big cudaMalloc carved by a first-fit allocator with coalescing: this is how --gpu-mem is a hard
// cap (nothing else allocates device memory after start-up, so the process's peak stays within the
// arena plus the CUDA context and the small cuBLAS handle state).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>

namespace lt::cuda {

class DeviceArena {
 public:
  static constexpr int64_t kAlign = 256;
  explicit DeviceArena(int64_t bytes);  // throws lt::Error with the CUDA message when cudaMalloc fails
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  // Throws lt::Error "device arena exhausted: ..." (asked, free in total, largest free block, arena size).
  void* allocate(int64_t bytes, const char* tag);
  void release(void* p);
  int64_t size() const { return size_; }
  int64_t in_use() const;
  int64_t largest_free() const;
  int64_t peak() const { return peak_; }

 private:
  char* base_ = nullptr;
  int64_t size_ = 0, used_ = 0, peak_ = 0;
  std::map<int64_t, int64_t> free_;  // offset -> bytes
  std::map<int64_t, int64_t> live_;  // offset -> bytes
  mutable std::mutex mu_;
};

// Page-locked host memory: mmap'd pages registered with cudaHostRegister. On failure the error says
// how much was asked, the memlock and cgroup limits in force, and what to change.
void* pinned_alloc(int64_t bytes, int64_t already_pinned);
void pinned_free(void* p, int64_t bytes);

}  // namespace lt::cuda
