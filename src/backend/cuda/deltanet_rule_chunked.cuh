// Internal to the chunk-parallel rule kernels (GdnRuleImpl::Chunked: deltanet_rule_fwd_chunked.cu,
// deltanet_rule_bwd_chunked.cu): their arguments, the chunk geometry, row loads and the per-chunk prep kernel.
//   chunk_prep  (chunk, value head, sample): A (as KM = KK o M, j < i), P = scale QK o M (j <= i), the UT solves
//               W = (I+A)^-1 diag(b G) K and U = (I+A)^-1 diag(b) V, written to the workspace; with `bwd` also
//               KM and Dl = U - W S0 (S0 from the chunk states). Once per chunk: the per-tile kernels of the Mma
//               implementation redo these per value tile.
// Workspace (fp32): W [T,Hv,Dk], U, Dl, dDl [T,Hv,Dv], P, KM [batch,nck,Hv,64,64], dS [batch,nck,Hv,Dk,Dv]; the
// forward uses W, U, P only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/deltanet.h"
#include "backend/cuda/deltanet_rule.cuh"

namespace lt::cuda::gdn {

struct ChunkedArgs {
  const bf16 *q, *k, *v;
  const float *g, *beta;
  const int32_t* seg;
  const float* states;  // [batch, nck, Hv, Dk, Dv]
  const bf16* dout;
  float *dqn, *dkn, *dv, *dg, *dbeta;  // outputs (dqn, dkn += : zeroed by the launcher)
  float *W, *U, *Dl, *dDl, *KM, *P, *dS;  // workspace
  bf16* o;                                 // forward output
  int64_t seq, nck;
  int Hk, Hv, Dk, Dv, nt;
  float scale;
};

constexpr int kPad = 8;  // row padding of the shared tiles (keeps the fragment loads off one bank)

// One chunk of one sample: rows [t0, t0 + L), s0 its first row within the sample.
struct Chunk {
  int64_t s0, t0;
  int L;
  bool zero_start;
  __device__ Chunk(const ChunkedArgs& p, int64_t b, int64_t c) {
    s0 = c * kC;
    t0 = b * p.seq + s0;
    L = int(p.seq - s0 < kC ? p.seq - s0 : int64_t(kC));
    zero_start = chunk_zero_start(p.seg, t0, s0);
  }
};

// dst [64, ld] bf16 <- rows [t0, t0 + L) of src (row stride sstride, n columns from col0); zero rows >= L.
__device__ __forceinline__ void load_rows_bf16(bf16* dst, int ld, const bf16* src, int64_t sstride, int n, int L) {
  const int half = n / 2;
  for (int idx = threadIdx.x; idx < kC * half; idx += blockDim.x) {
    const int i = idx / half, c2 = (idx % half) * 2;
    __nv_bfloat162 x = __floats2bfloat162_rn(0.f, 0.f);
    if (i < L) x = *reinterpret_cast<const __nv_bfloat162*>(src + i * sstride + c2);
    *reinterpret_cast<__nv_bfloat162*>(dst + i * ld + c2) = x;
  }
}
__device__ __forceinline__ void load_rows_f32(float* dst, int ld, const float* src, int64_t sstride, int n, int L) {
  const int half = n / 2;
  for (int idx = threadIdx.x; idx < kC * half; idx += blockDim.x) {
    const int i = idx / half, c2 = (idx % half) * 2;
    float2 x = make_float2(0.f, 0.f);
    if (i < L) x = *reinterpret_cast<const float2*>(src + i * sstride + c2);
    *reinterpret_cast<float2*>(dst + i * ld + c2) = x;
  }
}
__device__ __forceinline__ void store_rows_f32(float* dst, int64_t dstride, const float* src, int ld, int n, int L) {
  for (int idx = threadIdx.x; idx < L * n; idx += blockDim.x) {
    const int i = idx / n, c = idx % n;
    dst[i * dstride + c] = src[i * ld + c];
  }
}
__device__ __forceinline__ void copy_f32(float* dst, const float* src, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// The chunked kernels run the batch in groups of samples (the rule restarts at every sample, so groups are
// independent) so that the workspace stays near kGroupTokens rows whatever the batch: at the 27B shape, batch
// 72 x 1024 would otherwise take 12.7 GB.
constexpr int64_t kGroupTokens = 8192;
inline int64_t sample_group(const GdnDims& d) {
  return std::max<int64_t>(1, std::min<int64_t>(d.batch, kGroupTokens / std::max<int64_t>(d.seq, 1)));
}
// Calls f(sub, b0) for each group: sub = d with batch = the group's size, b0 = its first sample.
template <typename F>
void for_sample_groups(const GdnDims& d, F f) {
  const int64_t n = sample_group(d);
  for (int64_t b0 = 0; b0 < d.batch; b0 += n) {
    GdnDims sub = d;
    sub.batch = std::min(n, d.batch - b0);
    f(sub, b0);
  }
}

// Workspace pieces in floats, in layout order, for one group of samples (sample_group).
struct ChunkedWs {
  int64_t W, U, Dl, dDl, KM, P, dS;
  explicit ChunkedWs(const GdnDims& d) {
    const int64_t nb = sample_group(d), T = nb * d.seq, nck = gdn_rule_num_chunks(d);
    W = T * d.Hv * d.Dk;
    U = Dl = dDl = T * d.Hv * d.Dv;
    KM = P = nb * nck * d.Hv * kC * kC;
    dS = nb * nck * d.Hv * d.Dk * d.Dv;
  }
  int64_t fwd_floats() const { return W + U + P; }
  int64_t floats() const { return W + U + Dl + dDl + KM + P + dS; }
};

// Arguments with the workspace pointers set (layout above) and the shape fields filled; outputs left null.
ChunkedArgs chunked_args(const GdnDims& d, const void* qn, const void* kn, const void* v, const float* g,
                         const float* beta, const int32_t* seg, const float* states, void* ws, int nt);
// Launches chunk_prep over every (chunk, value head, sample).
void launch_chunk_prep(const GdnDims& d, const ChunkedArgs& a, bool bwd, cudaStream_t st);
int shared_optin();

}  // namespace lt::cuda::gdn
