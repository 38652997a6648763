// Finiteness probes for tracking down where NaN/Inf first appears on the GPU. The layers and the attention mixer
// call them when their KernelOptions::check_finite is on (kernel_options.h, env LT_CHECK_FINITE=1): each probe
// then synchronizes its stream and counts the non-finite values of a tensor, so a run is much slower; the first
// few non-finite findings are logged with the caller's context (layer, tensor, geometry). A diagnostic, not a
// training path: the trainer's own check names the first non-finite parameter or layer gradient without it.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace lt::cuda {

// Number of non-finite values among n bf16 (or fp32) values at p; synchronizes st. Logs a warning naming `what`
// when there are any (the first 32 findings of the process).
int64_t check_finite_bf16(const void* p, int64_t n, const std::string& what, cudaStream_t st);
int64_t check_finite_f32(const float* p, int64_t n, const std::string& what, cudaStream_t st);
// Watches the outputs of a fast path for non-finite values without synchronizing: count() enqueues a count into
// mapped host memory, and tripped() reads what finished work has counted so far (it lags the enqueued work). The
// caller switches to its fallback once tripped; the step that tripped it keeps its non-finite values (the trainer
// skips and reports that step).
class NonFiniteGuard {
 public:
  NonFiniteGuard() = default;
  NonFiniteGuard(const NonFiniteGuard&) = delete;
  NonFiniteGuard& operator=(const NonFiniteGuard&) = delete;
  ~NonFiniteGuard();
  void count(const void* p, int64_t n, bool bf16, cudaStream_t st);
  bool tripped() const { return host_ && *host_ > 0; }
  unsigned long long seen() const { return host_ ? *host_ : 0; }  // finished work's count so far
  void reset() {
    if (host_) *host_ = 0;
  }

 private:
  volatile unsigned long long* host_ = nullptr;
  unsigned long long* dev_ = nullptr;
};

// The kernel: adds the count of non-finite values among n (bf16 or fp32) at p to *out (device-visible).
void count_nonfinite_async(const void* p, int64_t n, bool bf16, unsigned long long* out, cudaStream_t st);

}  // namespace lt::cuda
