// The index tensors of cuDNN's packed (ragged, "THD") attention from our per-row segment ids: every run of
// equal ids within a sample is one causal sequence (data/batch.cpp packs samples as such runs, padding as
// one more). attention_cudnn.cpp hands the arrays to its ragged graphs.
#include <cub/block/block_scan.cuh>

#include "backend/cuda/attention/attention_cudnn.h"
#include "backend/cuda/cuda_util.h"

namespace lt::cuda {

namespace {
constexpr int kThreads = 1024;

// One block: the start row of every run, in order, into starts[0..n); starts[n..slots] = T.
__global__ void run_starts(const int32_t* __restrict__ seg, int64_t T, int64_t seq, int slots, int32_t* starts) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int base;
  if (threadIdx.x == 0) base = 0;
  __syncthreads();
  for (int64_t r0 = 0; r0 < T; r0 += kThreads) {
    const int64_t r = r0 + threadIdx.x;
    const int start = r < T && (r % seq == 0 || seg[r] != seg[r - 1]) ? 1 : 0;
    int before = 0, total = 0;
    Scan(tmp).ExclusiveSum(start, before, total);
    const int i = base + before;
    if (start && i < slots) starts[i] = int32_t(r);
    __syncthreads();  // everyone read `base` before it moves
    if (threadIdx.x == 0) base += total;
    __syncthreads();
  }
  for (int i = base + int(threadIdx.x); i <= slots; i += kThreads) starts[i] = int32_t(T);
}

// Per slot: sequence length and the element offsets of q/o, k/v and the [T, heads] statistics.
__global__ void run_offsets(const int32_t* __restrict__ starts, int slots, int64_t q_row, int64_t kv_row,
                            int64_t st_row, PackedIndex ix) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i > slots) return;
  const int64_t r = starts[i];
  ix.q_off[i] = int32_t(r * q_row);
  ix.kv_off[i] = int32_t(r * kv_row);
  ix.st_off[i] = int32_t(r * st_row);
  if (i < slots) ix.len[i] = starts[i + 1] - starts[i];
}
}  // namespace

void packed_attention_index(const AttnDims& d, const int32_t* segments, int slots, const PackedIndex& ix,
                            cudaStream_t st) {
  run_starts<<<1, kThreads, 0, st>>>(segments, d.tokens(), d.seq, slots, ix.starts);
  LT_CUDA(cudaGetLastError());
  run_offsets<<<(slots + 1 + 255) / 256, 256, 0, st>>>(ix.starts, slots, d.heads * d.head_dim,
                                                        d.kv_heads * d.head_dim, d.heads, ix);
  LT_CUDA(cudaGetLastError());
}

}  // namespace lt::cuda
