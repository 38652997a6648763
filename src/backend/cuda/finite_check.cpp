#include "backend/cuda/finite_check.h"

#include <atomic>

#include "backend/cuda/cuda_util.h"
#include "core/log.h"

namespace lt::cuda {

NonFiniteGuard::~NonFiniteGuard() {
  if (host_) cudaFreeHost(const_cast<unsigned long long*>(host_));
}

void NonFiniteGuard::count(const void* p, int64_t n, bool bf16, cudaStream_t st) {
  if (!p || n <= 0) return;
  if (!host_) {
    unsigned long long* h = nullptr;
    LT_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&h), sizeof(*h), cudaHostAllocMapped));
    *h = 0;
    LT_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_), h, 0));
    host_ = h;
  }
  count_nonfinite_async(p, n, bf16, dev_, st);
}

namespace {
int64_t count(const void* p, int64_t n, bool bf16, const std::string& what, cudaStream_t st) {
  if (!p || n <= 0) return 0;
  static NonFiniteGuard counter;  // its mapped count, read after the stream syncs
  LT_CUDA(cudaStreamSynchronize(st));
  counter.reset();
  counter.count(p, n, bf16, st);
  LT_CUDA(cudaStreamSynchronize(st));
  const int64_t bad = int64_t(counter.seen());
  static std::atomic<int> reported{0};
  if (bad > 0 && reported.fetch_add(1) < 32) log_warn("finite check: {} has {} non-finite values of {}", what, bad, n);
  return bad;
}
}  // namespace

int64_t check_finite_bf16(const void* p, int64_t n, const std::string& what, cudaStream_t st) {
  return count(p, n, true, what, st);
}
int64_t check_finite_f32(const float* p, int64_t n, const std::string& what, cudaStream_t st) {
  return count(p, n, false, what, st);
}

}  // namespace lt::cuda
