// RMSNorm forward/backward (also per-head QK-norm: rows = tokens * heads, dim = head_dim) and the
// deterministic column-sum used for norm-weight and bias gradients.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/dev_common.cuh"
#include "backend/cuda/kernel_options.h"
#include "backend/cuda/kernels.h"

namespace lt::cuda {
namespace {
using namespace dev;

constexpr int kRowsPerBlock = 8;  // one warp per row
// Column-sum partials (fp32): the fused backward below keeps a [blocks, dim] set, ~2 blocks per SM.
constexpr int64_t kPartialCap = int64_t(1) << 21;
// The fused backward: a block of 256 threads per row, each thread 8 columns per 2,048 (up to 4 of them).
constexpr int kFusedThreads = 256, kFusedCols = 8 * kFusedThreads, kFusedMaxPasses = 4;

__global__ void rmsnorm_fwd_kernel(const bf16* x, const bf16* w, int64_t rows, int dim, float eps, bf16* y,
                                   float* rstd_out, float w_off) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const bf16* xr = x + row * dim;
  float ss = 0.f;
  for (int c = lane * 8; c < dim; c += 256) {
    float v[8];
    load8(xr + c, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
  }
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / float(dim) + eps);
  if (rstd_out && lane == 0) rstd_out[row] = r;
  bf16* yr = y + row * dim;
  for (int c = lane * 8; c < dim; c += 256) {
    float v[8], wv[8];
    load8(xr + c, v);
    load8(w + c, wv);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = v[i] * r * (wv[i] + w_off);
    store8(yr + c, v);
  }
}

// dx = r * w * dy - x * r^3 * mean(w * dy * x) (+ dres)
__global__ void rmsnorm_bwd_dx_kernel(const bf16* x, const bf16* w, const bf16* dy, const bf16* dres, int64_t rows,
                                      int dim, float eps, bf16* dx, float* rstd_out, float w_off) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const bf16* xr = x + row * dim;
  const bf16* dyr = dy + row * dim;
  float ss = 0.f, dot = 0.f;
  for (int c = lane * 8; c < dim; c += 256) {
    float v[8], wv[8], gv[8];
    load8(xr + c, v);
    load8(w + c, wv);
    load8(dyr + c, gv);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      ss += v[i] * v[i];
      dot += (wv[i] + w_off) * gv[i] * v[i];
    }
  }
  ss = warp_sum(ss);
  dot = warp_sum(dot);
  const float r = rsqrtf(ss / float(dim) + eps);
  const float k = r * r * r * dot / float(dim);
  if (lane == 0) rstd_out[row] = r;
  for (int c = lane * 8; c < dim; c += 256) {
    float v[8], wv[8], gv[8], o[8];
    load8(xr + c, v);
    load8(w + c, wv);
    load8(dyr + c, gv);
    if (dres) {
      load8(dres + row * dim + c, o);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] += r * (wv[i] + w_off) * gv[i] - v[i] * k;
    store8(dx + row * dim + c, o);
  }
}

// The same dx, with the weight gradient's column sums fused: block b takes rows [b rpb, (b + 1) rpb) one after
// another, all its threads on one row (thread t: columns 8 t + 2048 p), and keeps its columns' sums of
// dy x rstd in registers: x and dy are read once (the two-kernel path reads them twice; at 8,192 x 5,120, ncu:
// 129 + 54 + 6 us against 140 + 12 us). partial[b, c] for colsum_finish_kernel.
template <int NP>
__global__ void __launch_bounds__(kFusedThreads) rmsnorm_bwd_fused_kernel(const bf16* x, const bf16* w,
                                                                          const bf16* dy, const bf16* dres,
                                                                          int64_t rows, int dim, float eps,
                                                                          int64_t rpb, bf16* dx, float* rstd_out,
                                                                          float w_off, float* partial) {
  __shared__ float red[2][2][kFusedThreads / 32];  // [row parity][ss, dot][warp]: one barrier a row
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  float wv[NP][8], acc[NP][8];
#pragma unroll
  for (int p = 0; p < NP; ++p) {
    const int c = 8 * t + kFusedCols * p;
#pragma unroll
    for (int i = 0; i < 8; ++i) wv[p][i] = acc[p][i] = 0.f;
    if (c < dim) {
      load8(w + c, wv[p]);
#pragma unroll
      for (int i = 0; i < 8; ++i) wv[p][i] += w_off;
    }
  }
  const int64_t r0 = int64_t(blockIdx.x) * rpb, r1 = min(rows, r0 + rpb);
  for (int64_t row = r0; row < r1; ++row) {
    float xv[NP][8], gv[NP][8];
    float ss = 0.f, dot = 0.f;
#pragma unroll
    for (int p = 0; p < NP; ++p) {
      const int c = 8 * t + kFusedCols * p;
      if (c < dim) {
        load8(x + row * dim + c, xv[p]);
        load8(dy + row * dim + c, gv[p]);
#pragma unroll
        for (int i = 0; i < 8; ++i) ss += xv[p][i] * xv[p][i], dot += wv[p][i] * gv[p][i] * xv[p][i];
      }
    }
    ss = warp_sum(ss);
    dot = warp_sum(dot);
    const int par = int((row - r0) & 1);
    if (lane == 0) red[par][0][warp] = ss, red[par][1][warp] = dot;
    __syncthreads();
    ss = 0.f, dot = 0.f;
#pragma unroll
    for (int i = 0; i < kFusedThreads / 32; ++i) ss += red[par][0][i], dot += red[par][1][i];
    const float r = rsqrtf(ss / float(dim) + eps), k = r * r * r * dot / float(dim);
    if (t == 0) rstd_out[row] = r;
#pragma unroll
    for (int p = 0; p < NP; ++p) {
      const int c = 8 * t + kFusedCols * p;
      if (c < dim) {
        float o[8];
        if (dres) {
          load8(dres + row * dim + c, o);
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i) o[i] = 0.f;
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          o[i] += r * wv[p][i] * gv[p][i] - xv[p][i] * k;
          acc[p][i] += gv[p][i] * xv[p][i] * r;
        }
        store8(dx + row * dim + c, o);
      }
    }
  }
#pragma unroll
  for (int p = 0; p < NP; ++p) {
    const int c = 8 * t + kFusedCols * p;
    if (c < dim)
#pragma unroll
      for (int i = 0; i < 8; ++i) partial[int64_t(blockIdx.x) * dim + c + i] = acc[p][i];
  }
}

// partial[s, c] = sum over rows of split s of a[r, c] * (x ? x[r, c] * rstd[r] : 1)
__global__ void colsum_partial_kernel(const bf16* a, const bf16* x, const float* rstd, int64_t rows, int dim,
                                      int64_t rows_per_split, float* partial) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int s = blockIdx.y;
  if (c >= dim) return;
  const int64_t r0 = s * rows_per_split, r1 = min(rows, r0 + rows_per_split);
  float acc = 0.f;
  for (int64_t r = r0; r < r1; ++r) {
    float v = __bfloat162float(a[r * dim + c]);
    if (x) v *= __bfloat162float(x[r * dim + c]) * rstd[r];
    acc += v;
  }
  partial[int64_t(s) * dim + c] = acc;
}

__global__ void colsum_finish_kernel(const float* partial, int nsplit, int dim, float* out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  float acc = 0.f;
  for (int s = 0; s < nsplit; ++s) acc += partial[int64_t(s) * dim + c];
  out[c] += acc;
}

void colsum(const bf16* a, const bf16* x, const float* rstd, int64_t rows, int64_t dim, float* out, float* partial,
            cudaStream_t st) {
  const int64_t max_split = std::max<int64_t>(1, kPartialCap / dim);
  const int64_t nsplit = std::max<int64_t>(1, std::min<int64_t>(max_split, (rows + 31) / 32));
  const int64_t per = (rows + nsplit - 1) / nsplit;
  dim3 grid(unsigned((dim + 127) / 128), unsigned(nsplit));
  colsum_partial_kernel<<<grid, 128, 0, st>>>(a, x, rstd, rows, int(dim), per, partial);
  LT_CUDA_LAUNCH();
  colsum_finish_kernel<<<unsigned((dim + 127) / 128), 128, 0, st>>>(partial, int(nsplit), int(dim), out);
  LT_CUDA_LAUNCH();
}

// KernelOptions::norm_bwd = Split (LT_NORM_BWD=split): the two-kernel path for every dim (to compare; the tests
// run both).
bool fused_norm_off() { return kernel_options().norm_bwd == NormBwd::Split; }

}  // namespace

int64_t norm_partial_floats(int64_t dim) { return std::max<int64_t>(kPartialCap, dim); }

void rmsnorm_fwd(const void* x, const void* w, int64_t rows, int64_t dim, float eps, void* y, float* rstd,
                 cudaStream_t st, float w_offset) {
  LT_CUDA_REQUIRE(dim % 8 == 0, "rmsnorm: dim must be a multiple of 8");
  if (rows == 0) return;
  rmsnorm_fwd_kernel<<<unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, st>>>(
      static_cast<const bf16*>(x), static_cast<const bf16*>(w), rows, int(dim), eps, static_cast<bf16*>(y), rstd,
      w_offset);
  LT_CUDA_LAUNCH();
}

void rmsnorm_bwd(const void* x, const void* w, const void* dy, const void* dres, int64_t rows, int64_t dim, float eps,
                 void* dx, float* dw, float* rstd, float* partial, cudaStream_t st, float w_offset) {
  LT_CUDA_REQUIRE(dim % 8 == 0, "rmsnorm: dim must be a multiple of 8");
  if (rows == 0) return;
  // Hidden-size rows: the fused kernel (a block a row); per-head norms (dim = head_dim, many short rows): a warp a
  // row and the column sums after.
  const int np = int((dim + kFusedCols - 1) / kFusedCols);
  if (dim >= 1024 && np <= kFusedMaxPasses && !fused_norm_off()) {
    int dev = 0, sms = 0;
    LT_CUDA(cudaGetDevice(&dev));
    LT_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int64_t nblk = std::max<int64_t>(1, std::min({kPartialCap / dim, int64_t(2) * sms, rows}));
    const int64_t rpb = (rows + nblk - 1) / nblk, used = (rows + rpb - 1) / rpb;
    const auto* xb = static_cast<const bf16*>(x);
    const auto* wb = static_cast<const bf16*>(w);
    const auto* gb = static_cast<const bf16*>(dy);
    const auto* rb = static_cast<const bf16*>(dres);
    auto* ob = static_cast<bf16*>(dx);
    const unsigned grid = unsigned(used);
    if (np == 1)
      rmsnorm_bwd_fused_kernel<1><<<grid, kFusedThreads, 0, st>>>(xb, wb, gb, rb, rows, int(dim), eps, rpb, ob, rstd,
                                                                  w_offset, partial);
    else if (np == 2)
      rmsnorm_bwd_fused_kernel<2><<<grid, kFusedThreads, 0, st>>>(xb, wb, gb, rb, rows, int(dim), eps, rpb, ob, rstd,
                                                                  w_offset, partial);
    else if (np == 3)
      rmsnorm_bwd_fused_kernel<3><<<grid, kFusedThreads, 0, st>>>(xb, wb, gb, rb, rows, int(dim), eps, rpb, ob, rstd,
                                                                  w_offset, partial);
    else
      rmsnorm_bwd_fused_kernel<4><<<grid, kFusedThreads, 0, st>>>(xb, wb, gb, rb, rows, int(dim), eps, rpb, ob, rstd,
                                                                  w_offset, partial);
    LT_CUDA_LAUNCH();
    colsum_finish_kernel<<<unsigned((dim + 127) / 128), 128, 0, st>>>(partial, int(used), int(dim), dw);
    LT_CUDA_LAUNCH();
    return;
  }
  rmsnorm_bwd_dx_kernel<<<unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, st>>>(
      static_cast<const bf16*>(x), static_cast<const bf16*>(w), static_cast<const bf16*>(dy),
      static_cast<const bf16*>(dres), rows, int(dim), eps, static_cast<bf16*>(dx), rstd, w_offset);
  LT_CUDA_LAUNCH();
  // dw[c] += sum_r dy[r,c] * x[r,c] * rstd[r]  (d(y)/d(w) = x * rstd, with or without the offset)
  colsum(static_cast<const bf16*>(dy), static_cast<const bf16*>(x), rstd, rows, dim, dw, partial, st);
}

void colsum_accum(const void* a, int64_t rows, int64_t dim, float* db, float* partial, cudaStream_t st) {
  if (rows == 0) return;
  colsum(static_cast<const bf16*>(a), nullptr, nullptr, rows, dim, db, partial, st);
}

}  // namespace lt::cuda
