// Element-wise kernels: RoPE (full or partial), SwiGLU, the gated attention's split/join and sigmoid
// output gate, residual add, dtype conversions, row gather.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/dev_common.cuh"
#include "backend/cuda/kernels.h"

namespace lt::cuda {
namespace {
using namespace dev;

unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

// One thread per (row, head, i < hd/2). For i < rot/2 it rotates the pair (i, i + rot/2) (HF
// rotate-half convention within the first rot entries); for i >= rot/2 (partial RoPE) it passes the
// entries rot + 2(i - rot/2) and the next one through, which matters only when reading fp32 src.
__global__ void rope_kernel(bf16* x, const float* src, int64_t rows, int heads, int hd, int rot, const int32_t* pos,
                            int64_t seq, const float* inv_freq, bool inverse) {
  const int half = hd / 2, rhalf = rot / 2;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * heads * half) return;
  const int i = int(idx % half);
  const int64_t rh = idx / half;  // row * heads + head
  const int64_t base = rh * hd;
  if (i >= rhalf) {
    if (!src) return;
    const int j = rot + 2 * (i - rhalf);
    x[base + j] = __float2bfloat16(src[base + j]);
    x[base + j + 1] = __float2bfloat16(src[base + j + 1]);
    return;
  }
  const int64_t row = rh / heads;
  const float p = pos ? float(pos[row]) : float(row % seq);
  float sn, cs;
  sincosf(p * inv_freq[i], &sn, &cs);
  float a, b;
  if (src) {
    a = src[base + i];
    b = src[base + i + rhalf];
  } else {
    a = __bfloat162float(x[base + i]);
    b = __bfloat162float(x[base + i + rhalf]);
  }
  if (inverse) sn = -sn;
  x[base + i] = __float2bfloat16(a * cs - b * sn);
  x[base + i + rhalf] = __float2bfloat16(b * cs + a * sn);
}

__device__ __forceinline__ float sigmoidf(float v) { return 1.f / (1.f + __expf(-v)); }

__global__ void swiglu_fwd_kernel(const bf16* gu, int64_t rows, int64_t f, bf16* act) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // pair index
  const int64_t fp = f / 2;
  if (idx >= rows * fp) return;
  const int64_t r = idx / fp, c = (idx % fp) * 2;
  const float2 gv = unpack_bf16(*reinterpret_cast<const uint32_t*>(gu + r * 2 * f + c));
  const float2 uv = unpack_bf16(*reinterpret_cast<const uint32_t*>(gu + r * 2 * f + f + c));
  *reinterpret_cast<uint32_t*>(act + r * f + c) =
      pack_bf16(gv.x * sigmoidf(gv.x) * uv.x, gv.y * sigmoidf(gv.y) * uv.y);
}

__global__ void swiglu_bwd_kernel(const bf16* gu, const bf16* dact, int64_t rows, int64_t f, bf16* dgu) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t fp = f / 2;
  if (idx >= rows * fp) return;
  const int64_t r = idx / fp, c = (idx % fp) * 2;
  const float2 gv = unpack_bf16(*reinterpret_cast<const uint32_t*>(gu + r * 2 * f + c));
  const float2 uv = unpack_bf16(*reinterpret_cast<const uint32_t*>(gu + r * 2 * f + f + c));
  const float2 dv = unpack_bf16(*reinterpret_cast<const uint32_t*>(dact + r * f + c));
  float g[2] = {gv.x, gv.y}, u[2] = {uv.x, uv.y}, d[2] = {dv.x, dv.y}, dg[2], du[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float s = sigmoidf(g[j]);
    du[j] = d[j] * g[j] * s;
    dg[j] = d[j] * u[j] * s * (1.f + g[j] * (1.f - s));
  }
  *reinterpret_cast<uint32_t*>(dgu + r * 2 * f + c) = pack_bf16(dg[0], dg[1]);
  *reinterpret_cast<uint32_t*>(dgu + r * 2 * f + f + c) = pack_bf16(du[0], du[1]);
}

// 8 columns per thread (16-byte accesses) when f % 8 == 0.
__global__ void swiglu_fwd8_kernel(const bf16* gu, int64_t rows, int64_t f, bf16* act) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t f8 = f / 8;
  if (idx >= rows * f8) return;
  const int64_t r = idx / f8, c = (idx % f8) * 8;
  float g[8], u[8], a[8];
  unpack8(*reinterpret_cast<const uint4*>(gu + r * 2 * f + c), g);
  unpack8(*reinterpret_cast<const uint4*>(gu + r * 2 * f + f + c), u);
#pragma unroll
  for (int j = 0; j < 8; ++j) a[j] = g[j] * sigmoidf(g[j]) * u[j];
  *reinterpret_cast<uint4*>(act + r * f + c) = pack8(a);
}
__global__ void swiglu_bwd8_kernel(const bf16* gu, const bf16* dact, int64_t rows, int64_t f, bf16* dgu) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t f8 = f / 8;
  if (idx >= rows * f8) return;
  const int64_t r = idx / f8, c = (idx % f8) * 8;
  float g[8], u[8], d[8], dg[8], du[8];
  unpack8(*reinterpret_cast<const uint4*>(gu + r * 2 * f + c), g);
  unpack8(*reinterpret_cast<const uint4*>(gu + r * 2 * f + f + c), u);
  unpack8(*reinterpret_cast<const uint4*>(dact + r * f + c), d);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float s = sigmoidf(g[j]);
    du[j] = d[j] * g[j] * s;
    dg[j] = d[j] * u[j] * s * (1.f + g[j] * (1.f - s));
  }
  *reinterpret_cast<uint4*>(dgu + r * 2 * f + c) = pack8(dg);
  *reinterpret_cast<uint4*>(dgu + r * 2 * f + f + c) = pack8(du);
}

__global__ void split_halves_kernel(const bf16* src, int64_t rows, int64_t d, bf16* a, bf16* b) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * 2 * d) return;
  const int64_t r = idx / (2 * d), c = idx % (2 * d);
  if (c < d)
    a[r * d + c] = src[idx];
  else
    b[r * d + c - d] = src[idx];
}
__global__ void join_halves_kernel(const bf16* a, const bf16* b, int64_t rows, int64_t d, bf16* dst) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * 2 * d) return;
  const int64_t r = idx / (2 * d), c = idx % (2 * d);
  dst[idx] = c < d ? a[r * d + c] : b[r * d + c - d];
}
// 8 elements per thread when d % 8 == 0 (16-byte accesses).
__global__ void split_halves8_kernel(const bf16* src, int64_t rows, int64_t d, bf16* a, bf16* b) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t d8 = d / 8;
  if (idx >= rows * 2 * d8) return;
  const int64_t r = idx / (2 * d8), c = (idx % (2 * d8)) * 8;
  const uint4 v = *reinterpret_cast<const uint4*>(src + r * 2 * d + c);
  bf16* dst = c < d ? a + r * d + c : b + r * d + c - d;
  *reinterpret_cast<uint4*>(dst) = v;
}
__global__ void join_halves8_kernel(const bf16* a, const bf16* b, int64_t rows, int64_t d, bf16* dst) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t d8 = d / 8;
  if (idx >= rows * 2 * d8) return;
  const int64_t r = idx / (2 * d8), c = (idx % (2 * d8)) * 8;
  const bf16* s = c < d ? a + r * d + c : b + r * d + c - d;
  *reinterpret_cast<uint4*>(dst + r * 2 * d + c) = *reinterpret_cast<const uint4*>(s);
}

__global__ void sigmoid_gate_fwd_kernel(const bf16* o, const bf16* gate, int64_t n, bf16* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = __float2bfloat16(__bfloat162float(o[i]) * sigmoidf(__bfloat162float(gate[i])));
}
__global__ void sigmoid_gate_bwd_kernel(const bf16* o, const bf16* gate, const bf16* dout, int64_t n, bf16* d_o,
                                        bf16* dgate) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float s = sigmoidf(__bfloat162float(gate[i])), d = __bfloat162float(dout[i]), ov = __bfloat162float(o[i]);
  d_o[i] = __float2bfloat16(d * s);
  dgate[i] = __float2bfloat16(d * ov * s * (1.f - s));
}

__global__ void add_kernel(const bf16* a, const bf16* b, int64_t n2, bf16* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n2) return;
  const float2 x = unpack_bf16(reinterpret_cast<const uint32_t*>(a)[i]);
  const float2 y = unpack_bf16(reinterpret_cast<const uint32_t*>(b)[i]);
  reinterpret_cast<uint32_t*>(out)[i] = pack_bf16(x.x + y.x, x.y + y.y);
}

__global__ void f2b_kernel(const float* s, int64_t n, bf16* d) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) d[i] = __float2bfloat16(s[i]);
}
__global__ void b2f_kernel(const bf16* s, int64_t n, float* d) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) d[i] = __bfloat162float(s[i]);
}

__global__ void gather_rows_kernel(const bf16* src, const int64_t* rows, int64_t n_rows, int64_t dim, bf16* dst) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * dim) return;
  const int64_t r = i / dim, c = i % dim;
  dst[i] = src[rows[r] * dim + c];
}

}  // namespace

void rope_apply(void* x, const float* src_f32, int64_t rows, int64_t heads, int64_t hd, const int32_t* pos,
                int64_t seq, const float* inv_freq, bool inverse, cudaStream_t st, int64_t rot_dim) {
  const int64_t rot = rot_dim > 0 ? rot_dim : hd;
  LT_CUDA_REQUIRE(hd % 2 == 0 && rot % 2 == 0 && rot <= hd && (pos || seq > 0), "rope: bad head_dim, rot_dim or seq");
  const int64_t n = rows * heads * (hd / 2);
  if (n == 0) return;
  rope_kernel<<<blocks_for(n, 256), 256, 0, st>>>(static_cast<bf16*>(x), src_f32, rows, int(heads), int(hd), int(rot),
                                                  pos, seq, inv_freq, inverse);
  LT_CUDA_LAUNCH();
}

void swiglu_fwd(const void* gu, int64_t rows, int64_t f, void* act, cudaStream_t st) {
  LT_CUDA_REQUIRE(f % 2 == 0, "swiglu: ffn must be even");
  if (f % 8 == 0) {
    const int64_t n8 = rows * f / 8;
    if (n8 == 0) return;
    swiglu_fwd8_kernel<<<blocks_for(n8, 256), 256, 0, st>>>(static_cast<const bf16*>(gu), rows, f,
                                                            static_cast<bf16*>(act));
    LT_CUDA_LAUNCH();
    return;
  }
  const int64_t n = rows * f / 2;
  if (n == 0) return;
  swiglu_fwd_kernel<<<blocks_for(n, 256), 256, 0, st>>>(static_cast<const bf16*>(gu), rows, f,
                                                        static_cast<bf16*>(act));
  LT_CUDA_LAUNCH();
}

void swiglu_bwd(const void* gu, const void* dact, int64_t rows, int64_t f, void* dgu, cudaStream_t st) {
  LT_CUDA_REQUIRE(f % 2 == 0, "swiglu: ffn must be even");
  if (f % 8 == 0) {
    const int64_t n8 = rows * f / 8;
    if (n8 == 0) return;
    swiglu_bwd8_kernel<<<blocks_for(n8, 256), 256, 0, st>>>(static_cast<const bf16*>(gu),
                                                            static_cast<const bf16*>(dact), rows, f,
                                                            static_cast<bf16*>(dgu));
    LT_CUDA_LAUNCH();
    return;
  }
  const int64_t n = rows * f / 2;
  if (n == 0) return;
  swiglu_bwd_kernel<<<blocks_for(n, 256), 256, 0, st>>>(static_cast<const bf16*>(gu),
                                                        static_cast<const bf16*>(dact), rows, f,
                                                        static_cast<bf16*>(dgu));
  LT_CUDA_LAUNCH();
}

void split_halves(const void* src, int64_t rows, int64_t d, void* a, void* b, cudaStream_t st) {
  const int64_t n = rows * 2 * d;
  if (n == 0) return;
  if (d % 8 == 0)
    split_halves8_kernel<<<blocks_for(n / 8, 256), 256, 0, st>>>(static_cast<const bf16*>(src), rows, d,
                                                                  static_cast<bf16*>(a), static_cast<bf16*>(b));
  else
    split_halves_kernel<<<blocks_for(n, 256), 256, 0, st>>>(static_cast<const bf16*>(src), rows, d,
                                                             static_cast<bf16*>(a), static_cast<bf16*>(b));
  LT_CUDA_LAUNCH();
}

void join_halves(const void* a, const void* b, int64_t rows, int64_t d, void* dst, cudaStream_t st) {
  const int64_t n = rows * 2 * d;
  if (n == 0) return;
  if (d % 8 == 0)
    join_halves8_kernel<<<blocks_for(n / 8, 256), 256, 0, st>>>(static_cast<const bf16*>(a),
                                                                 static_cast<const bf16*>(b), rows, d,
                                                                 static_cast<bf16*>(dst));
  else
    join_halves_kernel<<<blocks_for(n, 256), 256, 0, st>>>(static_cast<const bf16*>(a), static_cast<const bf16*>(b),
                                                            rows, d, static_cast<bf16*>(dst));
  LT_CUDA_LAUNCH();
}

void sigmoid_gate_fwd(const void* o, const void* gate, int64_t n, void* out, cudaStream_t st) {
  if (n == 0) return;
  sigmoid_gate_fwd_kernel<<<blocks_for(n, 256), 256, 0, st>>>(static_cast<const bf16*>(o),
                                                               static_cast<const bf16*>(gate), n,
                                                               static_cast<bf16*>(out));
  LT_CUDA_LAUNCH();
}

void sigmoid_gate_bwd(const void* o, const void* gate, const void* dout, int64_t n, void* d_o, void* dgate,
                      cudaStream_t st) {
  if (n == 0) return;
  sigmoid_gate_bwd_kernel<<<blocks_for(n, 256), 256, 0, st>>>(
      static_cast<const bf16*>(o), static_cast<const bf16*>(gate), static_cast<const bf16*>(dout), n,
      static_cast<bf16*>(d_o), static_cast<bf16*>(dgate));
  LT_CUDA_LAUNCH();
}

void add_bf16(const void* a, const void* b, int64_t n, void* out, cudaStream_t st) {
  LT_CUDA_REQUIRE(n % 2 == 0, "add: element count must be even");
  if (n == 0) return;
  add_kernel<<<blocks_for(n / 2, 256), 256, 0, st>>>(static_cast<const bf16*>(a), static_cast<const bf16*>(b), n / 2,
                                                     static_cast<bf16*>(out));
  LT_CUDA_LAUNCH();
}

void f32_to_bf16(const float* src, int64_t n, void* dst, cudaStream_t st) {
  if (n == 0) return;
  f2b_kernel<<<blocks_for(n, 256), 256, 0, st>>>(src, n, static_cast<bf16*>(dst));
  LT_CUDA_LAUNCH();
}

void bf16_to_f32(const void* src, int64_t n, float* dst, cudaStream_t st) {
  if (n == 0) return;
  b2f_kernel<<<blocks_for(n, 256), 256, 0, st>>>(static_cast<const bf16*>(src), n, dst);
  LT_CUDA_LAUNCH();
}

void gather_rows(const void* src, const int64_t* rows, int64_t n_rows, int64_t dim, void* dst, cudaStream_t st) {
  if (n_rows * dim == 0) return;
  gather_rows_kernel<<<blocks_for(n_rows * dim, 256), 256, 0, st>>>(static_cast<const bf16*>(src), rows, n_rows, dim,
                                                                   static_cast<bf16*>(dst));
  LT_CUDA_LAUNCH();
}

}  // namespace lt::cuda
