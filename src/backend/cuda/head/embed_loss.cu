// Embedding forward/backward (deterministic), cross-entropy over fp32 logit chunks, loss and
// squared-gradient reductions in fp64 with a fixed summation order.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/dev_common.cuh"
#include "backend/cuda/kernels.h"

namespace lt::cuda {
namespace {
using namespace dev;

__global__ void embed_fwd_kernel(const bf16* emb, const int32_t* ids, int64_t n, int64_t hidden, int64_t vocab,
                                 bf16* x, int* err) {
  const int64_t chunks = hidden / 8;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * chunks) return;
  const int64_t t = i / chunks, c = (i % chunks) * 8;
  const int32_t id = ids[t];
  uint4 v = make_uint4(0, 0, 0, 0);
  if (id >= 0 && id < vocab)
    v = *reinterpret_cast<const uint4*>(emb + int64_t(id) * hidden + c);
  else if (err)
    atomicExch(err, 1);
  *reinterpret_cast<uint4*>(x + t * hidden + c) = v;
}

__global__ void iota_kernel(int32_t* v, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) v[i] = int32_t(i);
}

__device__ inline void add_rounded(float* a, float v) { *a += v; }
__device__ inline void add_rounded(bf16* a, float v) { *a = __float2bfloat16_rn(__bfloat162float(*a) + v); }

// One block per sorted position that starts a run of equal ids: sums that id's rows in token order and adds the sum
// to its row (bf16: rounded once, as add_f32_to_bf16 rounds).
template <class Acc>
__global__ void embed_bwd_kernel(const int32_t* keys, const int32_t* tok, int64_t n, int64_t hidden, int64_t vocab,
                                 const bf16* dx, Acc* demb) {
  const int64_t i = blockIdx.x;
  const int32_t id = keys[i];
  if ((i > 0 && keys[i - 1] == id) || id < 0 || id >= vocab) return;
  int64_t end = i + 1;
  while (end < n && keys[end] == id) ++end;
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = i; j < end; ++j) acc += __bfloat162float(dx[int64_t(tok[j]) * hidden + c]);
    add_rounded(demb + int64_t(id) * hidden + c, acc);
  }
}

struct EmbWs {
  int32_t *keys_out, *vals_in, *vals_out;
  void* temp;
  size_t temp_bytes;
};
size_t align256(size_t b) { return (b + 255) / 256 * 256; }
size_t cub_temp_bytes(int64_t n) {
  size_t bytes = 0;
  LT_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                          static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                          static_cast<int32_t*>(nullptr), int(n)));
  return bytes;
}

// Block-wide fp64 sum with a fixed order (warp shuffles, then warp 0 over the warp totals).
template <int THREADS>
__device__ double block_sum(double v, double* sh) {
  v = warp_sum(v);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sh[w] = v;
  __syncthreads();
  double r = 0;
  if (w == 0) {
    r = lane < THREADS / 32 ? sh[lane] : 0.0;
    r = warp_sum(r);
  }
  __syncthreads();
  return r;  // valid in thread 0
}

// One block per row: online max/sum-exp pass, then the gradient pass.
constexpr int kCeThreads = 512;
__global__ void __launch_bounds__(kCeThreads) ce_kernel(const float* logits, const int32_t* targets, int64_t vocab,
                                                        float scale, bf16* dlogits, float* row_loss, float* lse_out,
                                                        int* err) {
  __shared__ float sm[kCeThreads / 32], ss[kCeThreads / 32];
  __shared__ float s_lse;
  const int64_t r = blockIdx.x;
  const float* x = logits + r * vocab;
  const int32_t tgt = targets[r];
  const bool ignored = tgt == -100;
  const bool bad = !ignored && (tgt < 0 || tgt >= vocab);
  if (bad && threadIdx.x == 0 && err) atomicExch(err, 2);
  float m = -INFINITY, s = 0.f;
  for (int64_t c = threadIdx.x; c < vocab; c += kCeThreads) {
    const float v = x[c];
    if (v > m) {
      s = s * __expf(m - v) + 1.f;
      m = v;
    } else {
      s += __expf(v - m);
    }
  }
  // merge (m, s) pairs: warp, then block
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    const float mm = fmaxf(m, m2);
    s = (m == -INFINITY ? 0.f : s * __expf(m - mm)) + (m2 == -INFINITY ? 0.f : s2 * __expf(m2 - mm));
    m = mm;
  }
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sm[w] = m;
    ss[w] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = -INFINITY;
    for (int i = 0; i < kCeThreads / 32; ++i) M = fmaxf(M, sm[i]);
    double tot = 0;
    for (int i = 0; i < kCeThreads / 32; ++i) tot += double(ss[i]) * exp(double(sm[i] - M));
    const float lse = M + float(log(tot));
    s_lse = lse;
    row_loss[r] = (ignored || bad) ? 0.f : lse - x[tgt];
    if (lse_out) lse_out[r] = (ignored || bad) ? 0.f : lse;
  }
  __syncthreads();
  if (!dlogits) return;
  const float lse = s_lse;
  bf16* d = dlogits + r * vocab;
  const float sc = (ignored || bad) ? 0.f : scale;
  for (int64_t c = threadIdx.x; c < vocab; c += kCeThreads) {
    float g = __expf(x[c] - lse);
    if (c == tgt) g -= 1.f;
    d[c] = __float2bfloat16(g * sc);
  }
}

// The gradient of cross_entropy in vocabulary columns [v0, v0 + nv) from each row's lse: one block per row, the
// same expression as ce_kernel's gradient pass.
__global__ void __launch_bounds__(kCeThreads) ce_slice_grad_kernel(const float* logits, const int32_t* targets,
                                                                   int64_t v0, int64_t nv, int64_t vocab,
                                                                   const float* lse, float scale, bf16* dlogits) {
  const int64_t r = blockIdx.x;
  const float* x = logits + r * nv;
  const int32_t tgt = targets[r];
  const float sc = (tgt == -100 || tgt < 0 || tgt >= vocab) ? 0.f : scale;
  const float l = lse[r];
  bf16* d = dlogits + r * nv;
  for (int64_t c = threadIdx.x; c < nv; c += kCeThreads) {
    float g = sc == 0.f ? 0.f : __expf(x[c] - l);  // an ignored row's lse is 0: its exp could overflow
    if (c + v0 == tgt) g -= 1.f;
    d[c] = __float2bfloat16(g * sc);
  }
}

constexpr int kRedThreads = 1024;
__global__ void __launch_bounds__(kRedThreads) loss_acc_kernel(const float* row_loss, const int32_t* targets,
                                                               int64_t n, double* acc) {
  __shared__ double sh[kRedThreads / 32];
  double s = 0, c = 0;
  for (int64_t i = threadIdx.x; i < n; i += kRedThreads) {
    s += row_loss[i];
    c += targets[i] != -100 ? 1.0 : 0.0;
  }
  const double ts = block_sum<kRedThreads>(s, sh);
  const double tc = block_sum<kRedThreads>(c, sh);
  if (threadIdx.x == 0) {
    acc[0] += ts;
    acc[1] += tc;
  }
}

constexpr int kSumsqThreads = 256;
template <typename T>
__global__ void __launch_bounds__(kSumsqThreads) sumsq_partial_kernel(const T* g, int64_t n, double* partial) {
  __shared__ double sh[kSumsqThreads / 32];
  double s = 0;
  for (int64_t i = int64_t(blockIdx.x) * kSumsqThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kSumsqThreads) {
    const double v = float(g[i]);
    s += v * v;
  }
  const double t = block_sum<kSumsqThreads>(s, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = t;
}
__global__ void __launch_bounds__(kSumsqBlocks) sumsq_finish_kernel(const double* partial, double* out) {
  __shared__ double sh[kSumsqBlocks / 32];
  const double t = block_sum<kSumsqBlocks>(partial[threadIdx.x], sh);
  if (threadIdx.x == 0) *out += t;
}

__global__ void add_f32_kernel(float* acc, const float* g, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    acc[i] += g[i];
}

__global__ void add_f32_to_bf16_kernel(bf16* acc, const float* g, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    acc[i] = __float2bfloat16_rn(__bfloat162float(acc[i]) + g[i]);
}

}  // namespace

void embed_fwd(const void* emb, const int32_t* ids, int64_t n, int64_t hidden, int64_t vocab, void* x, int* err,
               cudaStream_t st) {
  LT_CUDA_REQUIRE(hidden % 8 == 0, "embedding: hidden must be a multiple of 8");
  const int64_t work = n * hidden / 8;
  if (work == 0) return;
  embed_fwd_kernel<<<unsigned((work + 255) / 256), 256, 0, st>>>(static_cast<const bf16*>(emb), ids, n, hidden, vocab,
                                                                 static_cast<bf16*>(x), err);
  LT_CUDA_LAUNCH();
}

int64_t embed_bwd_workspace_bytes(int64_t n) {
  return int64_t(3 * align256(size_t(n) * 4) + align256(cub_temp_bytes(n)));
}

namespace {

template <class Acc>
void embed_bwd_t(const int32_t* ids, int64_t n, int64_t hidden, int64_t vocab, const void* dx, Acc* demb,
                 void* workspace, int64_t workspace_bytes, cudaStream_t st) {
  if (n == 0) return;
  LT_CUDA_REQUIRE(n < (int64_t(1) << 31), "embedding backward: too many tokens");
  LT_CUDA_REQUIRE(workspace_bytes >= embed_bwd_workspace_bytes(n), "embedding backward: workspace too small");
  char* w = static_cast<char*>(workspace);
  const size_t a = align256(size_t(n) * 4);
  int32_t* keys_out = reinterpret_cast<int32_t*>(w);
  int32_t* vals_in = reinterpret_cast<int32_t*>(w + a);
  int32_t* vals_out = reinterpret_cast<int32_t*>(w + 2 * a);
  void* temp = w + 3 * a;
  size_t temp_bytes = cub_temp_bytes(n);
  iota_kernel<<<unsigned((n + 255) / 256), 256, 0, st>>>(vals_in, n);
  LT_CUDA_LAUNCH();
  // Stable LSD radix sort: equal ids keep token order, so each id's rows are summed in token order.
  LT_CUDA(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, keys_out, vals_in, vals_out, int(n), 0, 32, st));
  embed_bwd_kernel<Acc><<<unsigned(n), 256, 0, st>>>(keys_out, vals_out, n, hidden, vocab, static_cast<const bf16*>(dx),
                                                demb);
  LT_CUDA_LAUNCH();
}

}  // namespace

void embed_bwd(const int32_t* ids, int64_t n, int64_t hidden, int64_t vocab, const void* dx, float* demb,
               void* workspace, int64_t workspace_bytes, cudaStream_t st) {
  embed_bwd_t(ids, n, hidden, vocab, dx, demb, workspace, workspace_bytes, st);
}

void embed_bwd_acc_bf16(const int32_t* ids, int64_t n, int64_t hidden, int64_t vocab, const void* dx, void* acc,
                        void* workspace, int64_t workspace_bytes, cudaStream_t st) {
  embed_bwd_t(ids, n, hidden, vocab, dx, static_cast<bf16*>(acc), workspace, workspace_bytes, st);
}

void cross_entropy(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float grad_scale,
                   void* dlogits, float* row_loss, int* err, cudaStream_t st, float* lse) {
  if (n == 0) return;
  ce_kernel<<<unsigned(n), kCeThreads, 0, st>>>(logits, targets, vocab, grad_scale, static_cast<bf16*>(dlogits),
                                                row_loss, lse, err);
  LT_CUDA_LAUNCH();
}

void cross_entropy_slice_grad(const float* logits, const int32_t* targets, int64_t n, int64_t v0, int64_t nv,
                              int64_t vocab, const float* lse, float grad_scale, void* dlogits, cudaStream_t st) {
  if (n == 0 || nv == 0) return;
  ce_slice_grad_kernel<<<unsigned(n), kCeThreads, 0, st>>>(logits, targets, v0, nv, vocab, lse, grad_scale,
                                                           static_cast<bf16*>(dlogits));
  LT_CUDA_LAUNCH();
}

void loss_accumulate(const float* row_loss, const int32_t* targets, int64_t n, double* acc, cudaStream_t st) {
  loss_acc_kernel<<<1, kRedThreads, 0, st>>>(row_loss, targets, n, acc);
  LT_CUDA_LAUNCH();
}

template <typename T>
void sumsq_accum_t(const T* g, int64_t n, double* out, double* partial, cudaStream_t st) {
  sumsq_partial_kernel<T><<<kSumsqBlocks, kSumsqThreads, 0, st>>>(g, n, partial);
  LT_CUDA_LAUNCH();
  sumsq_finish_kernel<<<1, kSumsqBlocks, 0, st>>>(partial, out);
  LT_CUDA_LAUNCH();
}

void sumsq_accum(const float* g, int64_t n, double* out, double* partial, cudaStream_t st) {
  sumsq_accum_t(g, n, out, partial, st);
}

void sumsq_accum_bf16(const void* g, int64_t n, double* out, double* partial, cudaStream_t st) {
  sumsq_accum_t(static_cast<const bf16*>(g), n, out, partial, st);
}

void add_f32_to_bf16(void* acc, const float* g, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  add_f32_to_bf16_kernel<<<unsigned(blocks), 256, 0, st>>>(static_cast<bf16*>(acc), g, n);
  LT_CUDA_LAUNCH();
}

void add_f32(float* acc, const float* g, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  add_f32_kernel<<<unsigned(blocks), 256, 0, st>>>(acc, g, n);
  LT_CUDA_LAUNCH();
}

}  // namespace lt::cuda
