// Internal to the chunk-parallel rule kernels (GdnRuleImpl::Chunked: deltanet/rule_fwd_chunked.cu,
// deltanet/rule_bwd_chunked.cu): their arguments, the chunk geometry, row loads and the per-chunk prep kernel.
//   chunk_prep  (chunk, value head, sample): A (as KM = KK o M, j < i), P = scale QK o M (j <= i), the UT solves
//               W = (I+A)^-1 diag(b G) K and U = (I+A)^-1 diag(b) V, written to the workspace; the backward's
//               also KM and Dl = U - W S0 (S0 from the chunk states). The lean form (chunk_prep_lean_kernel,
//               deltanet/rule_fwd_chunked.cu: no W/U/P shared tiles) is the forward's, and the backward's with the
//               register passes; two CTAs per SM where the original fits one. Once per chunk: the per-tile kernels of the Mma implementation redo these per
//               value tile.
// Workspace (fp32): W [T,Hv,Dk], U, Dl, dDl [T,Hv,Dv], P, KM [batch,nck,Hv,64,64], dS [batch,nck,Hv,Dk,Dv]; the
// forward uses W, U, P only. With the register passes (deltanet/rule_pass_warp.cu) chunk_prep also writes W and P
// as bf16 (Wb, Pb: the operands those passes read with ldmatrix).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/deltanet/deltanet.h"
#include "backend/cuda/deltanet/rule.cuh"

namespace lt::cuda::gdn {

struct ChunkedArgs {
  const bf16 *q, *k, *v;
  const float *g, *beta;
  const int32_t* seg;
  const float* states;  // [batch, nck, Hv, Dk, Dv]: the chunk-start states (read by chunk_prep, chunk_grads)
  float* states_out;    // the same tensor, written by state_pass (forward only; null in the backward)
  const bf16* dout;
  float *dqn, *dkn, *dv, *dg, *dbeta;  // outputs (dqn, dkn += : zeroed by the launcher)
  float *W, *U, *Dl, *dDl, *KM, *P, *dS;  // workspace
  float* GG;                               // [batch, nck, Hv, 2, 64]: G, then Ge, of every chunk (chunk_prep)
  bf16 *Wb, *Pb;                           // bf16 copies of W, P; null unless the register passes run
  bf16* o;                                 // forward output
  int64_t seq, nck;
  int Hk, Hv, Dk, Dv, nt;
  float scale;
  // Schedule choices that leave the arithmetic as it is (KernelOptions::gdn_sched, gdn_sched_flags): the lean prep's KK/QK
  // products with ldmatrix fragments; chunk_grads loading the next value head's dO and Dl during step (8).
  bool prep_ldm, grads_prefetch;
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

// Tile loads are cp.async (16-byte pieces, all in flight at once): with one CTA of 8 warps per SM, plain
// load-then-store loops kept one global load per thread in flight and the loads dominated.
// dst [rows, ld] <- rows [0, valid) of src (row stride sstride, n columns), rows in [valid, rows) zeroed.
// n, ld, sstride times sizeof(T) and both bases must be multiples of 16 bytes. Complete with async_done().
template <typename T>
__device__ __forceinline__ void async_rows(T* dst, int ld, const T* src, int64_t sstride, int n, int rows,
                                           int valid) {
  constexpr int per = 16 / int(sizeof(T));
  const int pieces = n / per;
  for (int idx = threadIdx.x; idx < rows * pieces; idx += blockDim.x) {
    const int i = idx / pieces, c = (idx % pieces) * per;
    const bool ok = i < valid;
    dev::cp_async16(dst + i * ld + c, ok ? src + i * sstride + c : src, ok);
  }
}
// dst[0, n) <- src[0, n) (n a multiple of 4).
__device__ __forceinline__ void async_copy(float* dst, const float* src, int n) {
  for (int i = threadIdx.x * 4; i < n; i += blockDim.x * 4) dev::cp_async16(dst + i, src + i, true);
}
// Waits for this thread's async copies; a barrier must follow before other threads read them.
__device__ __forceinline__ void async_done() {
  dev::cp_async_commit();
  dev::cp_async_wait<0>();
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

// out[m * ostride + n] += scale * (sum of the products) + extra(m, n) for m < M, n < N, in global memory: the
// tensor-core block product of deltanet/rule.cuh with a load-all-then-store epilogue (a plain += would
// serialise each lane's loads and stores on their possible aliasing).
struct NoExtra {
  __device__ float operator()(int, int) const { return 0.f; }
};
template <bool kSplit, typename TA, typename TB, typename TA2, typename TB2, typename Extra>
__device__ __forceinline__ void gemm_add_global_impl(int M, int N, const Prod<TA, TB>& p1, const Prod<TA2, TB2>* p2,
                                                     float* out, int64_t ostride, float scale, Extra extra) {
  const int warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  const int tn = (N + 15) / 16, tiles = ((M + 15) / 16) * tn;
  for (int tile = warp; tile < tiles; tile += nwarp) {
    const int m0 = (tile / tn) * 16, n0 = (tile % tn) * 16;
    float old[2][4];  // loaded first: in flight during the products (they stalled the warp after them)
    mma_epilogue(M, N, m0, n0, [&](int m, int n, int s, int i) { old[s][i] = out[m * ostride + n]; });
    float acc[2][4] = {};
    mma_tile<kSplit>(p1, M, N, m0, n0, acc);
    if (p2) mma_tile<kSplit>(*p2, M, N, m0, n0, acc);
    mma_epilogue(M, N, m0, n0, [&](int m, int n, int s, int i) {
      out[m * ostride + n] = old[s][i] + scale * acc[s][i] + extra(m, n);
    });
  }
}
template <bool kSplit, typename TA, typename TB, typename Extra = NoExtra>
__device__ __forceinline__ void gemm_add_global(int M, int N, const Prod<TA, TB>& p, float* out, int64_t ostride,
                                                float scale, Extra extra = Extra()) {
  gemm_add_global_impl<kSplit>(M, N, p, static_cast<const Prod<TA, TB>*>(nullptr), out, ostride, scale, extra);
}
template <bool kSplit, typename TA, typename TB, typename TA2, typename TB2, typename Extra = NoExtra>
__device__ __forceinline__ void gemm2_add_global(int M, int N, const Prod<TA, TB>& p1, const Prod<TA2, TB2>& p2,
                                                 float* out, int64_t ostride, float scale, Extra extra = Extra()) {
  gemm_add_global_impl<kSplit>(M, N, p1, &p2, out, ostride, scale, extra);
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
  int64_t W, U, Dl, dDl, KM, P, dS, GG, Wb, Pb;  // Wb, Pb: bf16 pieces, counted in floats (two per float)
  explicit ChunkedWs(const GdnDims& d) {
    const int64_t nb = sample_group(d), T = nb * d.seq, nck = gdn_rule_num_chunks(d);
    W = T * d.Hv * d.Dk;
    U = Dl = dDl = T * d.Hv * d.Dv;
    KM = P = nb * nck * d.Hv * kC * kC;
    dS = nb * nck * d.Hv * d.Dk * d.Dv;
    GG = nb * nck * d.Hv * 2 * kC;
    Wb = (W / 2 + 3) / 4 * 4;  // 16-byte multiples keep the pieces after them aligned
    Pb = P / 2;
  }
  int64_t fwd_floats() const { return W + U + P + GG + Wb + Pb; }
  int64_t floats() const { return fwd_floats() + Dl + dDl + KM + dS; }
};

// One chunk's tiles for the serial passes (state_pass, ds_pass), double-buffered: the next chunk's copies are
// in flight while the current chunk computes. a: q rows, b: k rows (bf16 [64, Dk + pad]), W [64, Dk + pad],
// P [64, 64], T the pass's own [64, nt + pad] tile (U fp32 forward, dO bf16 backward), GG: G, Ge [2, 64].
template <typename TT>
struct PassTiles {
  bf16 *q, *k;
  float *W, *P, *GG;
  TT* T;
  __device__ void carve(Carve& cv, int Dk, int nt) {
    q = cv.take<bf16>(int64_t(kC) * (Dk + kPad));
    k = cv.take<bf16>(int64_t(kC) * (Dk + kPad));
    W = cv.take<float>(int64_t(kC) * (Dk + kPad));
    P = cv.take<float>(kC * kC);
    GG = cv.take<float>(2 * kC);
    T = cv.take<TT>(int64_t(kC) * (nt + kPad));
  }
  static int64_t bytes(int Dk, int nt) {
    return 2 * carve_bytes(int64_t(kC) * (Dk + kPad), 2) + carve_bytes(int64_t(kC) * (Dk + kPad), 4) +
           carve_bytes(kC * kC, 4) + carve_bytes(2 * kC, 4) + carve_bytes(int64_t(kC) * (nt + kPad), sizeof(TT));
  }
  // Starts the copies of chunk c (value head h, key head kh, columns e0.. of `tsrc`, whose rows have stride sv)
  // and commits them as one group.
  __device__ void issue(const ChunkedArgs& p, int64_t b, int64_t c, int h, int kh, const TT* tsrc, int64_t sv,
                        int nt) {
    const int64_t s0 = c * kC, t0 = b * p.seq + s0, cidx = (b * p.nck + c) * p.Hv + h;
    const int L = int(p.seq - s0 < kC ? p.seq - s0 : int64_t(kC)), Dk = p.Dk, ldk = Dk + kPad;
    const int64_t sqk = int64_t(p.Hk) * Dk, sw = int64_t(p.Hv) * Dk;
    async_rows(q, ldk, p.q + t0 * sqk + kh * Dk, sqk, Dk, kC, L);
    async_rows(k, ldk, p.k + t0 * sqk + kh * Dk, sqk, Dk, kC, L);
    async_rows(W, ldk, p.W + t0 * sw + int64_t(h) * Dk, sw, Dk, kC, L);
    async_rows(T, nt + kPad, tsrc + t0 * sv, sv, nt, kC, L);
    async_copy(P, p.P + cidx * kC * kC, kC * kC);
    async_copy(GG, p.GG + cidx * 2 * kC, 2 * kC);
    dev::cp_async_commit();
  }
};

// Arguments with the workspace pointers set (layout above) and the shape fields filled; outputs left null.
ChunkedArgs chunked_args(const GdnDims& d, const void* qn, const void* kn, const void* v, const float* g,
                         const float* beta, const int32_t* seg, const float* states, void* ws, int nt);
// kern<true> or kern<false> as gdn_split_products() says: the precision of the products (GdnRulePrecision).
// The Split instantiations (kern<true>) are comparison variants: Bf16 is the default.
#define LT_GDN_SPLIT_KERNEL(kern) (gdn_split_products() ? kern<true> : kern<false>)
// dst rows [0, L) (row stride dstride) <- bf16 of src rows (ld, n columns).
__device__ __forceinline__ void store_rows_bf16(bf16* dst, int64_t dstride, const float* src, int ld, int n, int L) {
  for (int idx = threadIdx.x; idx < L * n; idx += blockDim.x) {
    const int i = idx / n, c = idx % n;
    dst[i * dstride + c] = __float2bfloat16(src[i * ld + c]);
  }
}

// Launches chunk_prep over every (chunk, value head, sample).
void launch_chunk_prep(const GdnDims& d, const ChunkedArgs& a, bool bwd, cudaStream_t st);
int shared_optin();

// The register passes (deltanet/rule_pass_warp.cu): whether they run for this shape and precision (Bf16 products,
// Dk 64 or 128, Dv a multiple of 16 up to 128, their shared memory fits; KernelOptions::gdn_passes = Tile forces
// the tile passes), and their launches over one group of samples (a.Wb, a.Pb set).
bool warp_passes(const GdnDims& d);
void launch_state_pass_warp(const GdnDims& s, const ChunkedArgs& a, cudaStream_t st);
void launch_ds_pass_warp(const GdnDims& s, const ChunkedArgs& a, cudaStream_t st);

}  // namespace lt::cuda::gdn
