// Fallback attention for head dims the tensor-core kernels do not cover (any even head_dim <= 256):
// one warp per (sample, head, query row), online softmax, keys streamed from global memory; still
// no S x S matrix in memory. Backward adds dK/dV with fp32 atomics (not bit-deterministic). Used for
// the tiny models of the HF fixtures; the real shapes (64, 128) take attention.cu.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/dev_common.cuh"
#include "backend/cuda/kernels.h"

namespace lt::cuda {
namespace {
using namespace dev;
constexpr int kMaxPerLane = 8;  // head_dim <= 256

struct GP {
  const bf16 *q, *k, *v, *o, *dout;
  const int32_t* seg;
  bf16* out;
  float* lse;
  const float* delta;
  float *dq, *dk, *dv;
  int64_t batch;
  int S, heads, kv_heads, hd;
  float scale;
};

__device__ __forceinline__ void load_row(const bf16* p, int hd, float (&r)[kMaxPerLane]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    r[i] = d < hd ? __bfloat162float(p[d]) : 0.f;
  }
}
__device__ __forceinline__ float dotw(const float (&a)[kMaxPerLane], const float (&b)[kMaxPerLane]) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) s += a[i] * b[i];
  return warp_sum(s);
}

__global__ void gen_fwd_kernel(GP p) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= p.batch * p.S * p.heads) return;
  const int h = int(w % p.heads);
  const int64_t row = w / p.heads;  // b*S + i
  const int64_t b = row / p.S;
  const int i = int(row % p.S);
  const int kvh = h / (p.heads / p.kv_heads);
  const int64_t q_ld = int64_t(p.heads) * p.hd, kv_ld = int64_t(p.kv_heads) * p.hd;
  float q[kMaxPerLane], acc[kMaxPerLane] = {};
  load_row(p.q + row * q_ld + h * p.hd, p.hd, q);
  const int32_t si = p.seg ? p.seg[row] : 0;
  float m = -INFINITY, l = 0.f;
  for (int j = 0; j <= i; ++j) {
    const int64_t rj = b * p.S + j;
    if (p.seg && p.seg[rj] != si) continue;
    float kr[kMaxPerLane], vr[kMaxPerLane];
    load_row(p.k + rj * kv_ld + kvh * p.hd, p.hd, kr);
    const float s = dotw(q, kr) * p.scale;
    const float mn = fmaxf(m, s);
    const float a = __expf(m - mn), e = __expf(s - mn);
    load_row(p.v + rj * kv_ld + kvh * p.hd, p.hd, vr);
#pragma unroll
    for (int t = 0; t < kMaxPerLane; ++t) acc[t] = acc[t] * a + e * vr[t];
    l = l * a + e;
    m = mn;
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) {
    const int d = lane + 32 * t;
    if (d < p.hd) p.out[row * q_ld + h * p.hd + d] = __float2bfloat16(acc[t] * inv);
  }
  if (lane == 0) p.lse[row * p.heads + h] = m + logf(l);
}

__global__ void gen_bwd_kernel(GP p) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= p.batch * p.S * p.heads) return;
  const int h = int(w % p.heads);
  const int64_t row = w / p.heads;
  const int64_t b = row / p.S;
  const int i = int(row % p.S);
  const int kvh = h / (p.heads / p.kv_heads);
  const int64_t q_ld = int64_t(p.heads) * p.hd, kv_ld = int64_t(p.kv_heads) * p.hd;
  float q[kMaxPerLane], dO[kMaxPerLane], o[kMaxPerLane], dq[kMaxPerLane] = {};
  load_row(p.q + row * q_ld + h * p.hd, p.hd, q);
  load_row(p.dout + row * q_ld + h * p.hd, p.hd, dO);
  load_row(p.o + row * q_ld + h * p.hd, p.hd, o);
  const float delta = dotw(dO, o);
  const float lse = p.lse[row * p.heads + h];
  const int32_t si = p.seg ? p.seg[row] : 0;
  for (int j = 0; j <= i; ++j) {
    const int64_t rj = b * p.S + j;
    if (p.seg && p.seg[rj] != si) continue;
    float kr[kMaxPerLane], vr[kMaxPerLane];
    load_row(p.k + rj * kv_ld + kvh * p.hd, p.hd, kr);
    load_row(p.v + rj * kv_ld + kvh * p.hd, p.hd, vr);
    const float pr = __expf(dotw(q, kr) * p.scale - lse);
    const float ds = pr * (dotw(dO, vr) - delta) * p.scale;
#pragma unroll
    for (int t = 0; t < kMaxPerLane; ++t) {
      const int d = lane + 32 * t;
      dq[t] += ds * kr[t];
      if (d < p.hd) {
        atomicAdd(p.dk + rj * kv_ld + kvh * p.hd + d, ds * q[t]);
        atomicAdd(p.dv + rj * kv_ld + kvh * p.hd + d, pr * dO[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) {
    const int d = lane + 32 * t;
    if (d < p.hd) p.dq[row * q_ld + h * p.hd + d] = dq[t];
  }
}

GP make(const AttnDims& d) {
  LT_CUDA_REQUIRE(d.head_dim > 0 && d.head_dim <= 32 * kMaxPerLane, "attention (generic): head_dim must be <= 256");
  LT_CUDA_REQUIRE(d.heads > 0 && d.kv_heads > 0 && d.heads % d.kv_heads == 0,
                  "attention: heads must be a positive multiple of kv_heads");
  GP p{};
  p.batch = d.batch;
  p.S = int(d.seq);
  p.heads = int(d.heads);
  p.kv_heads = int(d.kv_heads);
  p.hd = int(d.head_dim);
  p.scale = d.scale;
  return p;
}
unsigned blocks(const AttnDims& d) { return unsigned((d.tokens() * d.heads * 32 + 255) / 256); }

}  // namespace

void attention_fwd_generic(const AttnDims& d, const void* q, const void* k, const void* v, const int32_t* segments,
                           void* o, float* lse, cudaStream_t st) {
  GP p = make(d);
  p.q = static_cast<const bf16*>(q);
  p.k = static_cast<const bf16*>(k);
  p.v = static_cast<const bf16*>(v);
  p.seg = segments;
  p.out = static_cast<bf16*>(o);
  p.lse = lse;
  if (d.tokens() == 0) return;
  gen_fwd_kernel<<<blocks(d), 256, 0, st>>>(p);
  LT_CUDA_LAUNCH();
}

void attention_bwd_generic(const AttnDims& d, const void* q, const void* k, const void* v, const int32_t* segments,
                           const void* o, const float* lse, const void* dout, void* dk, void* dv, float* dq_f32,
                           float* dkv_f32, cudaStream_t st) {
  GP p = make(d);
  const int64_t nkv = d.tokens() * d.kv_heads * d.head_dim;
  p.q = static_cast<const bf16*>(q);
  p.k = static_cast<const bf16*>(k);
  p.v = static_cast<const bf16*>(v);
  p.o = static_cast<const bf16*>(o);
  p.dout = static_cast<const bf16*>(dout);
  p.seg = segments;
  p.lse = const_cast<float*>(lse);
  p.dq = dq_f32;
  p.dk = dkv_f32;
  p.dv = dkv_f32 + nkv;
  if (d.tokens() == 0) return;
  LT_CUDA(cudaMemsetAsync(dkv_f32, 0, size_t(2 * nkv) * sizeof(float), st));
  gen_bwd_kernel<<<blocks(d), 256, 0, st>>>(p);
  LT_CUDA_LAUNCH();
  f32_to_bf16(p.dk, nkv, dk, st);
  f32_to_bf16(p.dv, nkv, dv, st);
}

}  // namespace lt::cuda
