// The counting kernel of finite_check.h (the logging side: finite_check.cpp).
#include <cuda_bf16.h>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/finite_check.h"

namespace lt::cuda {

namespace {
__device__ float as_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ float as_float(float v) { return v; }

template <typename T>
__global__ void count_nonfinite(const T* __restrict__ p, int64_t n, unsigned long long* out) {
  unsigned long long c = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    c += isfinite(as_float(p[i])) ? 0 : 1;
  if (c) atomicAdd(out, c);
}
}  // namespace

void count_nonfinite_async(const void* p, int64_t n, bool bf16, unsigned long long* out, cudaStream_t st) {
  const int blocks = int((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024);
  if (bf16)
    count_nonfinite<<<blocks, 256, 0, st>>>(static_cast<const __nv_bfloat16*>(p), n, out);
  else
    count_nonfinite<<<blocks, 256, 0, st>>>(static_cast<const float*>(p), n, out);
  LT_CUDA(cudaGetLastError());
}

}  // namespace lt::cuda
