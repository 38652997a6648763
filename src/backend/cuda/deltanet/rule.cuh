// Internal to deltanet/rule_fwd.cu / deltanet/rule_bwd.cu: the block-level GEMM helper and the per-chunk
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
#include <cuda_runtime.h>

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

// ---------------------------------------------------------------------------------------------------------
// Tensor-core path: the same products on warp-level mma.sync.m16n8k16 (bf16 x bf16 -> fp32 accumulate).
// Precision: a bf16 operand (q, k, dO) is exact in bf16; an fp32 operand (state, W, U, Dl, P, decays, any
// operand carrying the per-k scale) is split x = hi + lo (hi = bf16(x), lo = bf16(x - hi)) and the product is
// A_hi B_hi + A_lo B_hi + A_hi B_lo (the lo x lo term, ~2^-16 relative, is dropped): ~16 mantissa bits per
// operand instead of fp32's 24, accumulation in fp32. A per-k scale goes to the bf16 side only when the other
// side is fp32 anyway (so q/k stay exact when possible).
// Work split: warp w takes output tiles 16 x 16 (two m16n8 accumulators) round-robin; every lane calls epi
// for the 8 elements it owns (row g / g+8, cols 2t, 2t+1 of each n8 half, PTX fragment layout), elements
// outside [M, N) skipped; K, M, N need not be multiples of 16 (zero-padded fragments).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// hi/lo split of the pair (x0, x1) -> packed bf16x2 (x0 in the low half, as the fragment element order).
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo, bool need_lo) {
  hi = dev::pack_bf16(x0, x1);
  if (need_lo) {
    const float2 h = dev::unpack_bf16(hi);
    lo = dev::pack_bf16(x0 - h.x, x1 - h.y);
  } else {
    lo = 0u;
  }
}
// Two consecutive elements as float2 (p 4-byte aligned for bf16, 8-byte aligned for float).
__device__ __forceinline__ float2 ld2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 ld2(const bf16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

template <typename T>
struct IsBf16 {
  static constexpr bool value = false;
};
template <>
struct IsBf16<bf16> {
  static constexpr bool value = true;
};

// One product's fragments for k-step k0 of a 16 x 16 output tile at (m0, n0). kSplit = false: fp32 operands are
// rounded to bf16 once (one mma per fragment pair instead of up to three; GdnRulePrecision::Bf16).
template <typename TA, typename TB, bool kSplit = true>
struct MmaFrag {
  uint32_t ahi[4], alo[4], bhi[2][2], blo[2][2];
  bool asplit, bsplit;
  __device__ __forceinline__ void load(const Prod<TA, TB>& p, int M, int N, int m0, int n0, int k0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool scale_b = p.ks != nullptr && IsBf16<TA>::value && !IsBf16<TB>::value;
    const bool scale_a = p.ks != nullptr && !scale_b;
    asplit = kSplit && (!IsBf16<TA>::value || scale_a);
    bsplit = kSplit && (!IsBf16<TB>::value || scale_b);
    // Pairs along k: one 4-byte (bf16x2) / 8-byte (float2) load when the pair is contiguous (stride 1 along
    // k, even row stride, so the even-k offset is aligned); K is a multiple of 8, so k < K covers k + 1.
    const bool avec = p.sak == 1 && (p.sam & 1) == 0, bvec = p.sbk == 1 && (p.sbn & 1) == 0;
    auto A2 = [&](int m, int k, uint32_t& hi, uint32_t& lo) {
      float2 x = make_float2(0.f, 0.f);
      if (m < M && k < p.K) {
        x = avec ? ld2(p.a + m * p.sam + k) : make_float2(ldv(p.a + m * p.sam + k * p.sak),
                                                          ldv(p.a + m * p.sam + (k + 1) * p.sak));
        if (scale_a) x.x *= p.ks[k], x.y *= p.ks[k + 1];
      }
      split_pair(x.x, x.y, hi, lo, asplit);
    };
    auto B2 = [&](int k, int n, uint32_t& hi, uint32_t& lo) {
      float2 x = make_float2(0.f, 0.f);
      if (n < N && k < p.K) {
        x = bvec ? ld2(p.b + k + n * p.sbn) : make_float2(ldv(p.b + k * p.sbk + n * p.sbn),
                                                          ldv(p.b + (k + 1) * p.sbk + n * p.sbn));
        if (scale_b) x.x *= p.ks[k], x.y *= p.ks[k + 1];
      }
      split_pair(x.x, x.y, hi, lo, bsplit);
    };
    // A regs: {(g, 2t), (g, 2t+1)}, {(g+8, 2t), ..}, {(g, 2t+8), ..}, {(g+8, 2t+8), ..}
#pragma unroll
    for (int r = 0; r < 4; ++r) A2(m0 + g + (r & 1) * 8, k0 + 2 * t + (r >> 1) * 8, ahi[r], alo[r]);
    // B regs (n8 half s): {(2t, g), (2t+1, g)}, {(2t+8, g), (2t+9, g)}
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
      for (int r = 0; r < 2; ++r) B2(k0 + 2 * t + 8 * r, n0 + 8 * s + g, bhi[s][r], blo[s][r]);
  }
  __device__ __forceinline__ void mma(float (&acc)[2][4]) const {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      mma_bf16_16816(acc[s], ahi, bhi[s]);
      if (asplit) mma_bf16_16816(acc[s], alo, bhi[s]);
      if (bsplit) mma_bf16_16816(acc[s], ahi, blo[s]);
    }
  }
};

template <bool kSplit = true, typename TA, typename TB>
__device__ __forceinline__ void mma_tile(const Prod<TA, TB>& p, int M, int N, int m0, int n0, float (&acc)[2][4]) {
  for (int k0 = 0; k0 < p.K; k0 += 16) {
    MmaFrag<TA, TB, kSplit> f;
    f.load(p, M, N, m0, n0, k0);
    f.mma(acc);
  }
}

// epi(m, n, i) for the accumulator element index i of this lane (the caller picks acc[s][i] values).
template <typename Epi>
__device__ __forceinline__ void mma_epilogue(int M, int N, int m0, int n0, Epi epi) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int s = 0; s < 2; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = m0 + g + (i >> 1) * 8, n = n0 + 8 * s + 2 * t + (i & 1);
      if (m < M && n < N) epi(m, n, s, i);
    }
}

template <bool kSplit, typename TA, typename TB, typename Epi>
__device__ __forceinline__ void mma_gemm(int M, int N, const Prod<TA, TB>& p, Epi epi) {
  const int warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  const int tn = (N + 15) / 16, tiles = ((M + 15) / 16) * tn;
  for (int tile = warp; tile < tiles; tile += nwarp) {  // warp-uniform: every lane runs every mma
    const int m0 = (tile / tn) * 16, n0 = (tile % tn) * 16;
    float acc[2][4] = {};
    mma_tile<kSplit>(p, M, N, m0, n0, acc);
    mma_epilogue(M, N, m0, n0, [&](int m, int n, int s, int i) { epi(m, n, acc[s][i]); });
  }
}
template <bool kSplit, typename TA1, typename TB1, typename TA2, typename TB2, typename Epi>
__device__ __forceinline__ void mma_gemm2(int M, int N, const Prod<TA1, TB1>& p1, const Prod<TA2, TB2>& p2, Epi epi) {
  const int warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  const int tn = (N + 15) / 16, tiles = ((M + 15) / 16) * tn;
  for (int tile = warp; tile < tiles; tile += nwarp) {
    const int m0 = (tile / tn) * 16, n0 = (tile % tn) * 16;
    float acc1[2][4] = {}, acc2[2][4] = {};
    mma_tile<kSplit>(p1, M, N, m0, n0, acc1);
    mma_tile<kSplit>(p2, M, N, m0, n0, acc2);
    mma_epilogue(M, N, m0, n0, [&](int m, int n, int s, int i) { epi(m, n, acc1[s][i], acc2[s][i]); });
  }
}

// Path dispatch: kMma selects mma_gemm*, else the SIMT blk_gemm* (same contract); kSplit: MmaFrag.
template <bool kMma, bool kSplit = true, typename TA, typename TB, typename Epi>
__device__ __forceinline__ void gemm(int M, int N, const Prod<TA, TB>& p, Epi epi) {
  if constexpr (kMma)
    mma_gemm<kSplit>(M, N, p, epi);
  else
    blk_gemm(M, N, p, epi);
}
template <bool kMma, bool kSplit = true, typename TA1, typename TB1, typename TA2, typename TB2, typename Epi>
__device__ __forceinline__ void gemm2(int M, int N, const Prod<TA1, TB1>& p1, const Prod<TA2, TB2>& p2, Epi epi) {
  if constexpr (kMma)
    mma_gemm2<kSplit>(M, N, p1, p2, epi);
  else
    blk_gemm2(M, N, p1, p2, epi);
}

// ---------------------------------------------------------------------------------------------------------
// Register-resident triangular solves on one column of kC rows (thread per column, the column in 64
// registers, rows of the 64 x 64 matrix read as broadcast float4): no serial smem round trip per term.
// Rows >= L need no special case: their matrix rows/columns and right-hand sides are zero.
// Forward: x_i -= rs_i * sum_{j<i} Mx[i, j] x_j (i ascending; only j < i of Mx is read); rs = nullptr: 1.
__device__ __forceinline__ void fwd_subst(const float* Mx, const float* rs, float (&x)[kC]) {
#pragma unroll
  for (int i = 1; i < kC; ++i) {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < i; j += 4) {
      const float4 a = *reinterpret_cast<const float4*>(Mx + i * kC + j);
      s += a.x * x[j];
      if (j + 1 < i) s += a.y * x[j + 1];
      if (j + 2 < i) s += a.z * x[j + 2];
      if (j + 3 < i) s += a.w * x[j + 3];
    }
    x[i] -= (rs ? rs[i] : 1.f) * s;
  }
}
// The same on column X[0 .. kC) (stride ld) of a shared tile.
__device__ __forceinline__ void fwd_subst_col(const float* Mx, const float* rs, float* X, int ld) {
  float x[kC];
#pragma unroll
  for (int i = 0; i < kC; ++i) x[i] = X[i * ld];
  fwd_subst(Mx, rs, x);
#pragma unroll
  for (int i = 0; i < kC; ++i) X[i * ld] = x[i];
}
// Backward (transposed): y_i = x_i - sum_{j>i} rs_j Mx[j, i] y_j (right-looking: row j of Mx, float4); Mx's rows
// kLdM floats apart (a multiple of 4).
template <int kLdM = kC>
__device__ __forceinline__ void bwd_subst_col(const float* Mx, const float* rs, float* X, int ld) {
  float y[kC];
#pragma unroll
  for (int i = 0; i < kC; ++i) y[i] = X[i * ld];
#pragma unroll
  for (int j = kC - 1; j >= 1; --j) {
    const float z = rs[j] * y[j];
#pragma unroll
    for (int i = 0; i < j; i += 4) {
      const float4 a = *reinterpret_cast<const float4*>(Mx + j * kLdM + i);
      y[i] -= a.x * z;
      if (i + 1 < j) y[i + 1] -= a.y * z;
      if (i + 2 < j) y[i + 2] -= a.z * z;
      if (i + 3 < j) y[i + 3] -= a.w * z;
    }
  }
#pragma unroll
  for (int i = 0; i < kC; ++i) X[i * ld] = y[i];
}

// Per-chunk scalars in shared memory.
struct ChunkScal {
  double gam[kC];       // cumulative sum of g over the chunk rows (double, as the reference)
  float G[kC], Ge[kC], bt[kC];
  int sid[kC];          // segment index within the chunk; -1 for rows >= L
};

// Fills cs for rows [t0, t0 + L) of value head h (g, beta [T, Hv]); seg global [T] or nullptr. Rows load in
// parallel; warp 0 scans them (two rows per lane; the cumulative log-decays in double, as the reference).
// Contains __syncthreads (all threads must call it; blockDim.x >= kC). G/Ge valid after it returns.
__device__ __forceinline__ void load_chunk_scalars(ChunkScal& cs, const float* g, const float* beta,
                                                   const int32_t* seg, int64_t t0, int L, int Hv, int h) {
  const int tid = threadIdx.x;
  if (tid < kC) {
    const int i = tid;
    const bool valid = i < L;
    cs.gam[i] = valid ? double(g[(t0 + i) * Hv + h]) : 0.0;  // g_i until the scan
    cs.bt[i] = valid ? beta[(t0 + i) * Hv + h] : 0.f;
    cs.sid[i] = (valid && i > 0 && seg && seg[t0 + i] != seg[t0 + i - 1]) ? 1 : 0;  // segment starts
  }
  __syncthreads();
  if (tid < 32) {
    static_assert(kC == 64, "two rows per lane");
    const int i0 = 2 * tid;
    const double a = cs.gam[i0], b = cs.gam[i0 + 1];
    const int sa = cs.sid[i0], sb = cs.sid[i0 + 1];
    double x = a + b;
    int y = sa + sb;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {  // inclusive scan of the row pairs
      const double xn = __shfl_up_sync(0xffffffffu, x, o);
      const int yn = __shfl_up_sync(0xffffffffu, y, o);
      if (tid >= o) x += xn, y += yn;
    }
    double ex = __shfl_up_sync(0xffffffffu, x, 1);  // exclusive: the pairs before this lane's
    int ey = __shfl_up_sync(0xffffffffu, y, 1);
    if (tid == 0) ex = 0.0, ey = 0;
    cs.gam[i0] = ex + a;
    cs.gam[i0 + 1] = x;
    cs.sid[i0] = i0 < L ? ey + sa : -1;
    cs.sid[i0 + 1] = i0 + 1 < L ? y : -1;
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
__host__ __device__ inline int64_t carve_bytes(int64_t n, int64_t elem) { return (n * elem + 15) / 16 * 16; }

}  // namespace lt::cuda::gdn

namespace lt::cuda {
// The chunk-parallel forward and backward (GdnRuleImpl::Chunked, deltanet/rule_{fwd,bwd}_chunked.cu);
// gdn_rule_fwd / gdn_rule_bwd dispatch.
struct GdnDims;
// gdn_rule_precision() == Split: which instantiation (kSplit) of the Chunked kernels a launch takes.
bool gdn_split_products();
// KernelOptions::gdn_passes allows the register passes (gdn::warp_passes adds the shape's conditions).
bool gdn_warp_passes_allowed();
// KernelOptions::gdn_grads allows chunk_grads' bf16 operand path (with the register passes only).
bool gdn_grads_b16_allowed();
// KernelOptions::gdn_grads_cta: chunk_grads' threads per CTA on the bf16 operand path.
int gdn_grads_cta();
// KernelOptions::gdn_grads_tile = 32: chunk_grads' bf16 products in 16 x 32 warp tiles (one A fragment for
// two mma chains) instead of 16 x 16.
bool gdn_grads_wide();
// KernelOptions::gdn_sched (all, the default; none, prep, grads): bit 1 the lean prep's ldmatrix products, bit 2 chunk_grads'
// prefetch of the next head (ChunkedArgs::prep_ldm, grads_prefetch; the same arithmetic either way).
int gdn_sched_flags();
int64_t gdn_rule_fwd_chunked_workspace_bytes(const GdnDims& d);
void gdn_rule_fwd_chunked(const GdnDims& d, const void* qn, const void* kn, const void* v, const float* g,
                          const float* beta, const int32_t* seg, void* o, float* state_ws, void* ws, cudaStream_t st);
int64_t gdn_rule_bwd_chunked_workspace_bytes(const GdnDims& d);
void gdn_rule_bwd_chunked(const GdnDims& d, const void* qn, const void* kn, const void* v, const float* g,
                          const float* beta, const int32_t* seg, const float* state_ws, const void* dout, float* dqn,
                          float* dkn, float* dv, float* dg, float* dbeta, void* ws, cudaStream_t st);
}  // namespace lt::cuda
