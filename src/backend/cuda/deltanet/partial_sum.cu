// The ordered reduction of per-block parameter-gradient partials shared by the Gated DeltaNet backward kernels:
// the same sums in the same order on every run (deterministic gradients).
#include "backend/cuda/deltanet/row_common.cuh"

namespace lt::cuda::gdn_rows {
namespace {

// out[i] += sum_s partial[s, i] in split order.
__global__ void partial_finish_kernel(const float* partial, int64_t nsplit, int64_t n, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = 0.f;
  for (int64_t s = 0; s < nsplit; ++s) acc += partial[s * n + i];
  out[i] += acc;
}

// Same sums for few outputs over many splits: one block per output, a fixed strided split per thread and a fixed
// tree (deterministic). The one-thread-per-output kernel above spent 0.62 ms on the gated norm's 128 outputs x 6,144
// splits at the 27B shape.
__global__ void partial_finish_wide_kernel(const float* partial, int64_t nsplit, int64_t n, float* out) {
  __shared__ float red[256];
  const int64_t i = blockIdx.x;
  float acc = 0.f;
  for (int64_t s = threadIdx.x; s < nsplit; s += blockDim.x) acc += partial[s * n + i];
  red[threadIdx.x] = acc;
  __syncthreads();
  for (int h = blockDim.x / 2; h > 0; h >>= 1) {
    if (int(threadIdx.x) < h) red[threadIdx.x] += red[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[i] += red[0];
}

}  // namespace

// out[i] += sum_s partial[s, i], deterministic: a thread per output where the outputs outnumber the splits, else
// a block per output.
void partial_finish(const float* partial, int64_t nsplit, int64_t n, float* out, cudaStream_t st) {
  if (n >= nsplit)
    partial_finish_kernel<<<nblocks(n, 256), 256, 0, st>>>(partial, nsplit, n, out);
  else
    partial_finish_wide_kernel<<<unsigned(n), 256, 0, st>>>(partial, nsplit, n, out);
  LT_CUDA_LAUNCH();
}

}  // namespace lt::cuda::gdn_rows
