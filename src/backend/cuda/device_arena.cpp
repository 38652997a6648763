#include "backend/cuda/device_arena.h"

#include <cuda_runtime.h>
#include <sys/resource.h>

#include <fstream>
#include <string>

#include "backend/cuda/cuda_util.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "core/units.h"

namespace lt::cuda {

DeviceArena::DeviceArena(int64_t bytes) : alloc_(bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, size_t(alloc_.size()));
  if (e != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total_b);
    fail("CUDA backend: cannot allocate the device arena of {} ({}); the GPU has {} free of {}. Lower --gpu-mem.",
         format_bytes(double(alloc_.size())), cudaGetErrorString(e), format_bytes(double(free_b)),
         format_bytes(double(total_b)));
  }
  base_ = static_cast<char*>(p);
}

DeviceArena::~DeviceArena() {
  if (base_) cudaFree(base_);
}

void* DeviceArena::allocate(int64_t bytes, const char* tag, End end) { return base_ + alloc_.allocate(bytes, tag, end); }

void DeviceArena::release(void* p) {
  if (!p) return;
  alloc_.release(static_cast<char*>(p) - base_);
}

namespace {
std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (f) std::getline(f, s);
  return s.empty() ? "n/a" : s;
}
std::string limit_str(rlim_t v) { return v == RLIM_INFINITY ? "unlimited" : format_bytes(double(v)); }
}  // namespace

void* pinned_alloc(int64_t bytes, int64_t already_pinned) {
  const size_t len = size_t((bytes + 4095) / 4096 * 4096);
  void* p = host_map(len);  // huge pages advised before cudaHostRegister faults the pages in
  if (!p)
    fail("pinned memory: cannot map {} of host memory (already pinned by lazytrain: {})", format_bytes(double(len)),
         format_bytes(double(already_pinned)));
  const cudaError_t e = cudaHostRegister(p, len, cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    host_unmap(p, len);
    rlimit rl{};
    getrlimit(RLIMIT_MEMLOCK, &rl);
    fail("pinned memory: cudaHostRegister of {} failed ({}). Already pinned by lazytrain: {}. Limits in force: "
         "memlock (ulimit -l) soft {} hard {}; cgroup memory.max {}. Raise the memlock limit (ulimit -l unlimited, "
         "or memlock in /etc/security/limits.conf, or LimitMEMLOCK= for a systemd unit; containers: --ulimit "
         "memlock=-1), raise the cgroup limit, or lower host memory use (--cpu-mem / a plan with fewer CPU-tier "
         "checkpoints).",
         format_bytes(double(len)), cudaGetErrorString(e), format_bytes(double(already_pinned)),
         limit_str(rl.rlim_cur), limit_str(rl.rlim_max), read_first_line("/sys/fs/cgroup/memory.max"));
  }
  return p;
}

void pinned_free(void* p, int64_t bytes) {
  if (!p) return;
  cudaHostUnregister(p);
  host_unmap(p, size_t(bytes));
}

}  // namespace lt::cuda
