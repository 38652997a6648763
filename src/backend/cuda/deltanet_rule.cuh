// Internal to deltanet_rule_fwd.cu / deltanet_rule_bwd.cu: the block-level GEMM helper and the per-chunk
// scalars (cumulative log-decays, masks) of the chunked gated delta rule.
//
// Work split: one CTA per (value-column tile, head, sample); it walks the sample's fixed 64-row chunks in
// order (forward) or reverse order (backward). The recurrence is separable over the value columns e of
// the state S [Dk, Dv] (every product contracts over Dk or over rows, never over e), so a CTA holds the
// state tile S[:, e0:e0+nt] and needs nothing from other tiles; in the backward the gradients of q, k,
// g, beta are sums over e, so each tile produces partial sums that a finishing kernel adds in a fixed
// order. The chunk-level quantities (A, P, W) that do not depend on e are recomputed per tile.
//
// Masks (fixed chunk grid, segments inside a chunk): sid_i = number of segment starts in rows (0, i] of the
// chunk; rows i, j interact only when both are valid (i < L) and sid_i == sid_j; row i sees the chunk's
// start state only when sid_i == 0 (and that state is zero when the chunk itself starts a sample or a
// segment). In the CPU reference's names (ops_gdn_rule_impl.h), per chunk:
//   G_i  = exp(gam_i)          if sid_i == 0, else 0
//   Ge_j = exp(gam_last - gam_j) if sid_j == sid_last, else 0     (last = L-1)
//   M[i,j] = exp(gam_i - gam_j) if same(i, j), else 0
// which is the reference's function with the state reset at each segment start (every product of decays
// across a reset is zero), and every gradient formula keeps its form (d exp(x)/dx = exp(x) = 0 masked).
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/dev_common.cuh"

namespace lt::cuda::gdn {

using dev::bf16;
constexpr int kC = 64;          // chunk rows
constexpr int kThreads = 256;   // CTA size of the rule kernels

__device__ __forceinline__ float ldv(const float* p) { return *p; }
__device__ __forceinline__ float ldv(const bf16* p) { return __bfloat162float(*p); }

// One operand pair of a block GEMM: A(m, k) = a[m*sam + k*sak], B(k, n) = b[k*sbk + n*sbn], k < K;
// optional per-k scale ks[k] (nullptr: none).
template <typename TA, typename TB>
struct Prod {
  const TA* a;
  int sam, sak;
  const TB* b;
  int sbk, sbn;
  int K;
  const float* ks;
};
template <typename TA, typename TB>
__device__ __forceinline__ Prod<TA, TB> prod(const TA* a, int sam, int sak, const TB* b, int sbk, int sbn, int K,
                                             const float* ks = nullptr) {
  return Prod<TA, TB>{a, sam, sak, b, sbk, sbn, K, ks};
}

template <typename TA, typename TB>
__device__ __forceinline__ void mac_tile(const Prod<TA, TB>& p, int m0, int n0, float (&acc)[4][4]) {
  for (int k = 0; k < p.K; ++k) {
    const float s = p.ks ? p.ks[k] : 1.f;
    float av[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) av[i] = ldv(p.a + (m0 + i) * p.sam + k * p.sak) * s;
#pragma unroll
    for (int j = 0; j < 4; ++j) bv[j] = ldv(p.b + k * p.sbk + (n0 + j) * p.sbn);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
  }
}

// For every (m < M, n < N) (M, N multiples of 4): epi(m, n, sum_k A(m,k) B(k,n)), called once by the thread
// that owns the element. No synchronisation inside: the caller syncs between dependent phases.
template <typename TA, typename TB, typename Epi>
__device__ __forceinline__ void blk_gemm(int M, int N, const Prod<TA, TB>& p, Epi epi) {
  const int tn = N / 4, tiles = (M / 4) * tn;
  for (int tile = threadIdx.x; tile < tiles; tile += blockDim.x) {
    const int m0 = (tile / tn) * 4, n0 = (tile % tn) * 4;
    float acc[4][4] = {};
    mac_tile(p, m0, n0, acc);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) epi(m0 + i, n0 + j, acc[i][j]);
  }
}
// Two products over the same output: epi(m, n, acc1, acc2).
template <typename TA1, typename TB1, typename TA2, typename TB2, typename Epi>
__device__ __forceinline__ void blk_gemm2(int M, int N, const Prod<TA1, TB1>& p1, const Prod<TA2, TB2>& p2, Epi epi) {
  const int tn = N / 4, tiles = (M / 4) * tn;
  for (int tile = threadIdx.x; tile < tiles; tile += blockDim.x) {
    const int m0 = (tile / tn) * 4, n0 = (tile % tn) * 4;
    float acc1[4][4] = {}, acc2[4][4] = {};
    mac_tile(p1, m0, n0, acc1);
    mac_tile(p2, m0, n0, acc2);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) epi(m0 + i, n0 + j, acc1[i][j], acc2[i][j]);
  }
}

// Per-chunk scalars in shared memory.
struct ChunkScal {
  double gam[kC];       // cumulative sum of g over the chunk rows (double, as the reference)
  float G[kC], Ge[kC], bt[kC];
  int sid[kC];          // segment index within the chunk; -1 for rows >= L
};

// Fills cs for rows [t0, t0 + L) of value head h (g, beta [T, Hv]); seg global [T] or nullptr.
// Contains __syncthreads (all threads must call it). Returns nothing; G/Ge valid after it returns.
__device__ __forceinline__ void load_chunk_scalars(ChunkScal& cs, const float* g, const float* beta,
                                                   const int32_t* seg, int64_t t0, int L, int Hv, int h) {
  const int tid = threadIdx.x;
  if (tid == 0) {
    double cum = 0;
    int sid = 0;
    for (int i = 0; i < kC; ++i) {
      if (i < L) {
        if (i > 0 && seg && seg[t0 + i] != seg[t0 + i - 1]) ++sid;
        cum += double(g[(t0 + i) * Hv + h]);
        cs.sid[i] = sid;
        cs.bt[i] = beta[(t0 + i) * Hv + h];
      } else {
        cs.sid[i] = -1;
        cs.bt[i] = 0.f;
      }
      cs.gam[i] = cum;
    }
  }
  __syncthreads();
  if (tid < kC) {
    const int i = tid;
    const bool valid = cs.sid[i] >= 0;
    cs.G[i] = (valid && cs.sid[i] == 0) ? float(exp(cs.gam[i])) : 0.f;
    cs.Ge[i] = (valid && cs.sid[i] == cs.sid[L - 1]) ? float(exp(cs.gam[L - 1] - cs.gam[i])) : 0.f;
  }
  __syncthreads();
}

// M[i, j] for j <= i (masked), 0 otherwise.
__device__ __forceinline__ float decay(const ChunkScal& cs, int i, int j) {
  return (j <= i && cs.sid[i] >= 0 && cs.sid[i] == cs.sid[j]) ? expf(float(cs.gam[i] - cs.gam[j])) : 0.f;
}
__device__ __forceinline__ bool same_seg(const ChunkScal& cs, int i, int j) {
  return cs.sid[i] >= 0 && cs.sid[i] == cs.sid[j];
}

// Whether the chunk starting at sample row s0 (global row t0) starts with a zero state.
__device__ __forceinline__ bool chunk_zero_start(const int32_t* seg, int64_t t0, int64_t s0) {
  return s0 == 0 || (seg && seg[t0] != seg[t0 - 1]);
}

// Largest tile width nt of Dv (a multiple of 8 dividing Dv, <= cap) whose shared memory fits `limit`.
template <typename SmemFn>
inline int choose_tile(int Dv, int cap, int64_t limit, SmemFn smem) {
  for (int nt = std::min(Dv, cap); nt >= 8; nt -= 8)
    if (Dv % nt == 0 && smem(nt) <= limit) return nt;
  return 0;
}

// Shared-memory carve-out: bump allocator over a dynamic smem base (16-byte aligned pieces).
struct Carve {
  char* p;
  template <typename T>
  __device__ __forceinline__ T* take(int64_t n) {
    T* r = reinterpret_cast<T*>(p);
    p += (n * int64_t(sizeof(T)) + 15) / 16 * 16;
    return r;
  }
};
inline int64_t carve_bytes(int64_t n, int64_t elem) { return (n * elem + 15) / 16 * 16; }

}  // namespace lt::cuda::gdn
