// Shared by the Gated DeltaNet row-wise kernels (conv, prep, gated norm, decode step): the activation math in
// fp32 on bf16 data, the launch helpers, and the deterministic reduction of per-block parameter-gradient partials.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/deltanet/deltanet.h"
#include "backend/cuda/dev_common.cuh"

namespace lt::cuda::gdn_rows {
using dev::bf16;

constexpr int kMaxConvK = 8;
constexpr float kL2Eps = 1e-6f;

__device__ __forceinline__ float ldf(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float sigm(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float softplus_grad(float x) { return x > 20.f ? 1.f : sigm(x); }
__device__ __forceinline__ float silu_grad(float p) {
  const float s = sigm(p);
  return s * (1.f + p * (1.f - s));
}

// 4 consecutive bf16 entries as fp32 (8-byte load / store; p 8-byte aligned).
__device__ __forceinline__ void ld4(const bf16* p, float (&x)[4]) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
}
__device__ __forceinline__ void st4(bf16* p, const float (&x)[4]) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(x[0], x[1]), b = __floats2bfloat162_rn(x[2], x[3]);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&a);
  u.y = *reinterpret_cast<const uint32_t*>(&b);
  *reinterpret_cast<uint2*>(p) = u;
}

inline unsigned nblocks(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }
inline const bf16* B(const void* p) { return static_cast<const bf16*>(p); }
inline bf16* Bm(void* p) { return static_cast<bf16*>(p); }
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

inline void check_dims(const GdnDims& d) {
  LT_CUDA_REQUIRE(gdn_dims_supported(d),
                  "Gated DeltaNet kernels: unsupported shape (need batch, seq >= 0, Hk, Hv > 0, Hv % Hk == 0, Dk and "
                  "Dv multiples of 8 in [8, 128], conv kernel K in [1, 8])");
}

// out[i] += sum_s partial[s, i] over nsplit partials of n outputs, in a fixed order (partial_sum.cu).
void partial_finish(const float* partial, int64_t nsplit, int64_t n, float* out, cudaStream_t st);

}  // namespace lt::cuda::gdn_rows
