// Chunked gated delta rule, backward, chunk-parallel (GdnRuleImpl::Chunked, the default). Same function and
// formulas as rule_bwd_kernel (deltanet/rule_bwd.cu, steps (1)-(9) of the CPU reference), reorganised so that
// only the dS recurrence is serial over chunks:
//   1. chunk_prep   (deltanet/rule_chunked.cuh) with KM and Dl = U - W S0.
//   2. ds_pass      (value tile, value head, sample), chunks in reverse: dDl = P^T dO + diag(Ge) K dS and
//                    dS <- G_last dS + Q~^T diag(G) dO - W^T dDl; writes dDl and every chunk's dS (its end
//                    state's gradient). Two small products per chunk: the only serial part.
//   3. chunk_grads  (chunk, key head, sample), the value heads of the key head's group in order: steps (2)-(8)
//                    over the whole Dv (no partial sums across value tiles), then (9) the suffix sums of dgam.
//                    dq, dk of the key head are accumulated in head order by this CTA alone (deterministic).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/deltanet/deltanet.h"
#include "backend/cuda/deltanet/frag.cuh"
#include "backend/cuda/deltanet/rule_chunked.cuh"

namespace lt::cuda {
namespace {
using namespace gdn;

// ------------------------------------------------------------------------------------------- 2. ds_pass
int64_t ds_smem_bytes(int Dk, int nt) {
  return carve_bytes(int64_t(Dk) * (nt + kPad), 4) + carve_bytes(int64_t(kC) * (nt + kPad), 4) +
         2 * PassTiles<bf16>::bytes(Dk, nt);
}

template <bool kSplit>
__global__ void __launch_bounds__(kThreads) ds_pass_kernel(ChunkedArgs p) {
  extern __shared__ __align__(16) char smem[];
  const int Dk = p.Dk, Dv = p.Dv, Hv = p.Hv, Hk = p.Hk, nt = p.nt, h = blockIdx.y, kh = h / (Hv / Hk);
  const int e0 = blockIdx.x * nt;
  const int64_t b = blockIdx.z;
  const int ldk = Dk + kPad, ldt = nt + kPad;
  Carve cv{smem};
  float* dS = cv.take<float>(int64_t(Dk) * ldt);  // [Dk, nt]: dL/dS_end of the current chunk
  float* dD = cv.take<float>(int64_t(kC) * ldt);  // [64, nt]: dDl
  PassTiles<bf16> tl[2];                          // T: dO
  tl[0].carve(cv, Dk, nt);
  tl[1].carve(cv, Dk, nt);
  const int64_t sv = int64_t(Hv) * Dv;
  const bf16* osrc = p.dout + int64_t(h) * Dv + e0;
  const float scale = p.scale;
  for (int i = threadIdx.x; i < Dk * ldt; i += blockDim.x) dS[i] = 0.f;
  __syncthreads();  // the first chunk's store below reads dS in another thread-to-element order (found by racecheck)
  tl[0].issue(p, b, p.nck - 1, h, kh, osrc, sv, nt);
  for (int64_t it = 0; it < p.nck; ++it) {
    const int64_t c = p.nck - 1 - it;
    const PassTiles<bf16>& t = tl[it & 1];
    if (c > 0) {
      tl[(it + 1) & 1].issue(p, b, c - 1, h, kh, osrc, sv, nt);
      dev::cp_async_wait<1>();
    } else {
      dev::cp_async_wait<0>();
    }
    const Chunk ch(p, b, c);
    const int64_t cidx = (b * p.nck + c) * Hv + h;
    float* dSg = p.dS + cidx * int64_t(Dk) * Dv + e0;
    for (int idx = threadIdx.x; idx < Dk * nt; idx += blockDim.x) {
      const int d = idx / nt, e = idx % nt;
      dSg[int64_t(d) * Dv + e] = dS[d * ldt + e];
    }
    __syncthreads();
    const float* G = t.GG;
    const float* Ge = t.GG + kC;
    const bf16* dO = t.T;
    // (1) dDl = P^T dO + diag(Ge) K dS
    gemm2<true, kSplit>(kC, nt, prod(t.P, 1, kC, dO, ldt, 1, kC), prod(t.k, ldk, 1, dS, ldt, 1, Dk),
                [&](int j, int e, float a1, float a2) { dD[j * ldt + e] = a1 + Ge[j] * a2; });
    __syncthreads();
    float* dDg = p.dDl + ch.t0 * sv + int64_t(h) * Dv + e0;
    store_rows_f32(dDg, sv, dD, ldt, nt, ch.L);
    // dS0 = G_last dS + Q~^T diag(G) dO - W^T dDl (the previous chunk's dS; zero at a segment start)
    const float glast = G[ch.L - 1];
    const bool reset = ch.zero_start;
    gemm2<true, kSplit>(Dk, nt, prod(t.q, 1, ldk, dO, ldt, 1, kC, G), prod(t.W, 1, ldk, dD, ldt, 1, kC),
                [&](int d, int e, float a1, float a2) {
                  dS[d * ldt + e] = reset ? 0.f : glast * dS[d * ldt + e] + scale * a1 - a2;
                });
    __syncthreads();
  }
}

// ------------------------------------------------------------------------------------------- 3. chunk_grads
// Shared memory: every operand of a product is staged there first (cp.async); the [Dk, Dv] states S0 and dS
// go through the [64, max(Dk, Dv)] staging tile G in blocks of 64 rows.
// The [kC, kC] tiles KM, P, dP have rows kLa floats apart: with 64 the fragment loads of a warp hit one group of
// banks (ncu: a third of the kernel's shared-memory wavefronts were conflict excess).
constexpr int kLa = kC + kPad;
int64_t grads_smem_bytes(int Dk, int Dv) {
  const int ldg = std::max(Dk, Dv) + kPad;
  return carve_bytes(1, sizeof(ChunkScal)) + 2 * carve_bytes(int64_t(kC) * (Dk + kPad), 2) /*qs, ks*/ +
         carve_bytes(int64_t(kC) * (Dv + kPad), 2) /*dO, then v*/ + 3 * carve_bytes(kC * kLa, 4) /*KM, P, dP*/ +
         carve_bytes(int64_t(kC) * (Dk + kPad), 4) /*X*/ + carve_bytes(int64_t(kC) * (Dv + kPad), 4) /*Y*/ +
         carve_bytes(int64_t(kC) * ldg, 4) /*G*/ + carve_bytes(3 * kC + 32, 4) /*dgam, dbt, xs, red*/;
}

// sum over the lanes of a warp of f(j) for j = lane, lane + 32, ... < n.
template <typename F>
__device__ __forceinline__ float warp_row_sum(int n, F f) {
  float s = 0.f;
  for (int j = threadIdx.x & 31; j < n; j += 32) s += f(j);
  return dev::warp_sum(s);
}

// xs[i] = sum_{j > i, j < kC} f(j, i) for i < L: a thread per column i, so that column reads of a [kC, kC] tile
// (f reading M[j * kC + i]) hit consecutive banks; a warp-per-row sum over the column was a 32-way conflict.
template <typename F>
__device__ __forceinline__ void col_sums(int L, float* xs, F f) {
  const int i = threadIdx.x;
  if (i >= L) return;
  float s = 0.f;
  for (int j = i + 1; j < kC; ++j) s += f(j, i);
  xs[i] = s;
}

// For each block of (up to) 64 rows d0.. of a [Dk, Dv] fp32 state M (global): stage it in G (ld ldg), then
// use(d0, nd). Barriers before and after every block (all threads must call it).
template <typename F>
__device__ __forceinline__ void for_state_blocks(const float* M, int Dk, int Dv, float* G, int ldg, F use) {
  for (int d0 = 0; d0 < Dk; d0 += kC) {
    const int nd = Dk - d0 < kC ? Dk - d0 : int(kC);
    __syncthreads();
    async_rows(G, ldg, M + int64_t(d0) * Dv, Dv, Dv, kC, nd);
    async_done();
    __syncthreads();
    use(d0, nd);
  }
  __syncthreads();
}

// ---- kB16: the bf16 operand path (Bf16 products with the register passes: Dk 64 or 128, Dv a multiple of 16 up to
// 128). The states S0 and dS are staged whole as bf16 [Dk, Dv + pad] in the G region (one staging each instead of
// two 64-row fp32 blocks), W comes as bf16 from the workspace (Wb), and those products read them with ldmatrix;
// the rounding is the Bf16 precision's (every operand rounded to bf16 once, round to nearest).

// A fragment (16 x 16) of an fp32 tile stored [m][k] (k contiguous, ld even), rounded to bf16.
__device__ __forceinline__ void lda_f32(uint32_t (&a)[4], const float* t, int ld, int m0, int k0) {
  const int l = threadIdx.x & 31, g = l >> 2, tq = l & 3;
  const float* q = t + (m0 + g) * ld + k0 + 2 * tq;
  const float2 x0 = ld2(q), x1 = ld2(q + 8 * ld), x2 = ld2(q + 8), x3 = ld2(q + 8 * ld + 8);
  a[0] = dev::pack_bf16(x0.x, x0.y);
  a[1] = dev::pack_bf16(x1.x, x1.y);
  a[2] = dev::pack_bf16(x2.x, x2.y);
  a[3] = dev::pack_bf16(x3.x, x3.y);
}
// A fragment of an fp32 tile stored [k][m] (m contiguous), rounded to bf16 (element pairs along k: two loads).
__device__ __forceinline__ void lda_f32_kmajor(uint32_t (&a)[4], const float* t, int ld, int m0, int k0) {
  const int l = threadIdx.x & 31, g = l >> 2, tq = l & 3;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int m = m0 + g + (r & 1) * 8, k = k0 + 2 * tq + (r >> 1) * 8;
    a[r] = dev::pack_bf16(t[k * ld + m], t[(k + 1) * ld + m]);
  }
}
// The sum over k of A(m, k) B(k, n) for the 16 x 16 tile at (m0, n0) and, when `two`, the one at (m0, n0 + 16)
// (acc[2..3]: one A fragment serves both, and the warp has two independent mma chains), A and B from the loaders
// (load(frag, m0 or n0, k0)); K a multiple of 16, the tiles allocated up to the 16-multiples of M and N.
template <typename ALoad, typename BLoad>
__device__ __forceinline__ void ldm_tile(int K, ALoad load_a, BLoad load_b, int m0, int n0, bool two,
                                         float (&acc)[4][4]) {
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t a[4], b[4];
    load_a(a, m0, k0);
    load_b(b, n0, k0);
    mma_pair(acc, 0, a, b);
    if (two) {
      load_b(b, n0 + 16, k0);
      mma_pair(acc, 1, a, b);
    }
  }
}
// The warps' work units: 16 x 16 tiles (kWide false) or 16 x 32 pairs of them (kWide), round robin in row-major
// order; f(m0, n0, two) for each (two: the pair's second tile exists).
template <bool kWide, typename F>
__device__ __forceinline__ void for_warp_tiles(int M, int N, F f) {
  const int warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  constexpr int w = kWide ? 32 : 16;
  const int tn = (N + w - 1) / w, units = ((M + 15) / 16) * tn;
  for (int u = warp; u < units; u += nwarp) {
    const int m0 = (u / tn) * 16, n0 = (u % tn) * w;
    f(m0, n0, kWide && n0 + 16 < N);
  }
}
// epi(m, n, sum_k A(m, k) B(k, n)) for m < M, n < N.
template <bool kWide, typename ALoad, typename BLoad, typename Epi>
__device__ __forceinline__ void ldm_gemm(int M, int N, int K, ALoad load_a, BLoad load_b, Epi epi) {
  for_warp_tiles<kWide>(M, N, [&](int m0, int n0, bool two) {
    float acc[4][4] = {};
    ldm_tile(K, load_a, load_b, m0, n0, two, acc);
    mma_epilogue(M, N, m0, n0, [&](int m, int n, int s, int i) { epi(m, n, acc[s][i]); });
    if (two) mma_epilogue(M, N, m0, n0 + 16, [&](int m, int n, int s, int i) { epi(m, n, acc[2 + s][i]); });
  });
}
// out[m * ostride + n] += scale (A1 B1 [+ A2 B2]) + extra(m, n) in global memory, as gemm_add_global /
// gemm2_add_global (the second product's terms after the first's, loads before stores).
template <bool kWide, typename A1, typename B1, typename A2, typename B2, typename Extra>
__device__ __forceinline__ void ldm_gemm_add_global(int M, int N, int K, A1 a1, B1 b1, A2 a2, B2 b2, bool second,
                                                    float* out, int64_t ostride, float scale, Extra extra) {
  for_warp_tiles<kWide>(M, N, [&](int m0, int n0, bool two) {
    float old[4][4];  // loaded first: in flight during the products
    mma_epilogue(M, N, m0, n0, [&](int m, int n, int s, int i) { old[s][i] = out[m * ostride + n]; });
    if (two) mma_epilogue(M, N, m0, n0 + 16, [&](int m, int n, int s, int i) { old[2 + s][i] = out[m * ostride + n]; });
    float acc[4][4] = {};
    ldm_tile(K, a1, b1, m0, n0, two, acc);
    if (second) ldm_tile(K, a2, b2, m0, n0, two, acc);
    mma_epilogue(M, N, m0, n0, [&](int m, int n, int s, int i) {
      out[m * ostride + n] = old[s][i] + scale * acc[s][i] + extra(m, n);
    });
    if (two)
      mma_epilogue(M, N, m0, n0 + 16, [&](int m, int n, int s, int i) {
        out[m * ostride + n] = old[2 + s][i] + scale * acc[2 + s][i] + extra(m, n);
      });
  });
}
// Sb [Dk, Dv + pad] bf16 <- the fp32 state M [Dk, Dv] (global); with Wt, also *dot += <M, Wt> (this thread's
// part, fp32) from the same loads' rows of M. Barriers before and after.
template <bool kDot = false>
__device__ __forceinline__ void stage_state_bf16(const float* M, int Dk, int Dv, bf16* Sb, const float* Wt = nullptr,
                                                 float* dot = nullptr) {
  // A row per warp (no division by Dv), kRows rows' loads in flight per lane before their converted stores: one
  // load at a time stalled on global latency (ncu: 8 % of the kernel's stall samples at the packs). The
  // dot product rides on the staging's loads (it was a pass of its own over both states).
  constexpr int kRows = 4;
  const int lds = Dv + kPad, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  float acc = 0.f;
  __syncthreads();
  for (int e = 4 * lane; e < Dv; e += 128)
    for (int d0 = warp; d0 < Dk; d0 += kRows * nwarp) {
      float4 x[kRows], y[kRows];
#pragma unroll
      for (int u = 0; u < kRows; ++u)
        if (d0 + u * nwarp < Dk) {
          x[u] = *reinterpret_cast<const float4*>(M + (d0 + u * nwarp) * Dv + e);
          if constexpr (kDot) y[u] = *reinterpret_cast<const float4*>(Wt + (d0 + u * nwarp) * Dv + e);
        }
#pragma unroll
      for (int u = 0; u < kRows; ++u)
        if (d0 + u * nwarp < Dk) {
          *reinterpret_cast<uint2*>(Sb + (d0 + u * nwarp) * lds + e) =
              make_uint2(dev::pack_bf16(x[u].x, x[u].y), dev::pack_bf16(x[u].z, x[u].w));
          if constexpr (kDot) acc += x[u].x * y[u].x + x[u].y * y[u].y + x[u].z * y[u].z + x[u].w * y[u].w;
        }
    }
  if constexpr (kDot) *dot += acc;
  __syncthreads();
}
// Whether the bf16 states fit the G region: Dk (Dv + pad) bf16 <= 64 (max(Dk, Dv) + pad) fp32.
inline bool grads_b16_fits(int Dk, int Dv) {
  return int64_t(Dk) * (Dv + kPad) * 2 <= int64_t(kC) * (std::max(Dk, Dv) + kPad) * 4;
}

// Default: <false, true, 512, true> with the register passes, <false, false, kThreads> without. kSplit and the
// bf16 path's other CTA sizes and 16 x 16 tiles are comparison variants (KernelOptions::gdn_*).
// Length: one kernel body on purpose. Its stages (marked by the comments inside) share register-resident fragments
// and accumulators (the chunk's dq, dk, dv, gate and beta gradient tiles, stages (1)-(9)) and the shared-memory
// pipeline's stage indices; split into functions they would pass those arrays by reference across every call (kept
// in registers only when all of it inlines) and read no clearer than the numbered stage comments do.
template <bool kSplit, bool kB16, int kNT, bool kWide = false>
__global__ void __launch_bounds__(kNT) chunk_grads_kernel(ChunkedArgs p) {
  static_assert(!(kSplit && kB16), "the bf16 operand path is the Bf16 precision's");
  extern __shared__ __align__(16) char smem[];
  const int Dk = p.Dk, Dv = p.Dv, Hv = p.Hv, Hk = p.Hk, kh = blockIdx.y, group = Hv / Hk;
  const int64_t c = blockIdx.x, b = blockIdx.z;
  const Chunk ch(p, b, c);
  const int L = ch.L, last = L - 1, tid = threadIdx.x, nth = blockDim.x;
  const int warp = tid >> 5, lane = tid & 31, nwarp = nth >> 5;
  const int ldk = Dk + kPad, ldv_ = Dv + kPad, ldg = std::max(Dk, Dv) + kPad;
  const float scale = p.scale;
  Carve cv{smem};
  ChunkScal& cs = *cv.take<ChunkScal>(1);
  bf16* qs = cv.take<bf16>(int64_t(kC) * ldk);
  bf16* ks = cv.take<bf16>(int64_t(kC) * ldk);
  bf16* dO = cv.take<bf16>(int64_t(kC) * ldv_);  // dO, from (5) on v
  float* KM = cv.take<float>(kC * kLa);
  float* P = cv.take<float>(kC * kLa);   // P, later E = dA o b_i M
  float* dP = cv.take<float>(kC * kLa);  // dP -> dP o M -> dA
  float* X = cv.take<float>(int64_t(kC) * ldk);   // r, r2, dW -> YW
  float* Y = cv.take<float>(int64_t(kC) * ldv_);  // Dl, from (5) on dDl -> YU
  float* G = cv.take<float>(int64_t(kC) * ldg);   // staging: S0 / dS row blocks, U, W (kB16: bf16 S0 / dS, Wb)
  bf16* Sb = reinterpret_cast<bf16*>(G);
  const int lds = Dv + kPad;
  // Fragment loaders for the kB16 products: bf16 B stored [n][k] / [k][n], fp32 A stored [m][k] / [k][m].
  auto nmajor = [](const bf16* t, int ld) {
    return [=](uint32_t (&b)[4], int n0, int k0) { ldb_nmajor(b, t, ld, n0, k0); };
  };
  auto kmajor = [](const bf16* t, int ld) {
    return [=](uint32_t (&b)[4], int n0, int k0) { ldb_kmajor(b, t, ld, n0, k0); };
  };
  auto f32_m = [](const float* t, int ld) {
    return [=](uint32_t (&a)[4], int m0, int k0) { lda_f32(a, t, ld, m0, k0); };
  };
  auto f32_k = [](const float* t, int ld) {
    return [=](uint32_t (&a)[4], int m0, int k0) { lda_f32_kmajor(a, t, ld, m0, k0); };
  };
  auto bf16_m = [](const bf16* t, int ld) {
    return [=](uint32_t (&a)[4], int m0, int k0) { lda_mmajor(a, t, ld, m0, k0); };
  };
  float* dgam = cv.take<float>(3 * kC + 32);
  float* dbt = dgam + kC;
  float* xs = dbt + kC;
  float* red = xs + kC;
  const int64_t sqk = int64_t(Hk) * Dk, sv = int64_t(Hv) * Dv, sw = int64_t(Hv) * Dk;
  float* dq = p.dqn + ch.t0 * sqk + kh * Dk;  // rows of this chunk, key head kh (row stride sqk)
  float* dk = p.dkn + ch.t0 * sqk + kh * Dk;
  async_rows(qs, ldk, p.q + ch.t0 * sqk + kh * Dk, sqk, Dk, kC, L);
  async_rows(ks, ldk, p.k + ch.t0 * sqk + kh * Dk, sqk, Dk, kC, L);

  for (int h = kh * group; h < (kh + 1) * group; ++h) {
    const int64_t cidx = (b * p.nck + c) * Hv + h;
    const float* S0 = p.states + cidx * int64_t(Dk) * Dv;  // S0(d, e) = S0[d*Dv + e]
    const float* dSe = p.dS + cidx * int64_t(Dk) * Dv;
    const int64_t vrow0 = ch.t0 * sv + int64_t(h) * Dv, wrow0 = ch.t0 * sw + int64_t(h) * Dk;
    if (h == kh * group || !p.grads_prefetch) {  // else issued during the previous head's step (8)
      async_rows(dO, ldv_, p.dout + vrow0, sv, Dv, kC, L);
      async_rows(Y, ldv_, p.Dl + vrow0, sv, Dv, kC, L);
    }
    async_rows(KM, kLa, p.KM + cidx * kC * kC, kC, kC, kC, kC);
    async_rows(P, kLa, p.P + cidx * kC * kC, kC, kC, kC, kC);
    async_done();
    for (int i = tid; i < kC * kLa; i += nth) dP[i] = 0.f;  // the product below fills columns < L only
    if (tid < kC) dgam[tid] = dbt[tid] = 0.f;
    load_chunk_scalars(cs, p.g, p.beta, p.seg, ch.t0, L, Hv, h);  // syncs
    const float glast = cs.G[last];

    // (2) dP = dO Dl^T;  (3) r = dO S0^T (-> X), and <S0, dS> (for dgam_last) from the staged S0 blocks
    if constexpr (kB16) {  // Dl as bf16 in the staging region for ldmatrix
      for (int i = warp; i < kC; i += nwarp)
        for (int e = 2 * lane; e < Dv; e += 64) {
          const float2 x = ld2(Y + i * ldv_ + e);
          *reinterpret_cast<uint32_t*>(Sb + i * lds + e) = dev::pack_bf16(x.x, x.y);
        }
      __syncthreads();
      ldm_gemm<kWide>(kC, L, Dv, bf16_m(dO, ldv_), nmajor(Sb, lds),
                      [&](int i, int j, float acc) { dP[i * kLa + j] = acc; });
    } else {
      gemm<true, kSplit>(kC, L, prod(dO, ldv_, 1, Y, 1, ldv_, Dv),
                         [&](int i, int j, float acc) { dP[i * kLa + j] = acc; });
    }
    float sdot = 0.f;
    if constexpr (kB16) {
      stage_state_bf16<true>(S0, Dk, Dv, Sb, dSe, &sdot);
      ldm_gemm<kWide>(kC, Dk, Dv, bf16_m(dO, ldv_), nmajor(Sb, lds),
                      [&](int i, int d, float acc) { X[i * ldk + d] = acc; });
      __syncthreads();
    } else for_state_blocks(S0, Dk, Dv, G, ldg, [&](int d0, int nd) {
      gemm<true, kSplit>(kC, nd, prod(dO, ldv_, 1, G, 1, ldg, Dv),
                 [&](int i, int d, float acc) { X[i * ldk + d0 + d] = acc; });
      const float4* ds4 = reinterpret_cast<const float4*>(dSe + int64_t(d0) * Dv);
      const int n4 = nd * Dv / 4, per_row = Dv / 4;
#pragma unroll 8
      for (int idx = tid; idx < n4; idx += nth) {
        const float4 x = ds4[idx];
        const float* gr = G + (idx / per_row) * ldg + (idx % per_row) * 4;
        sdot += gr[0] * x.x + gr[1] * x.y + gr[2] * x.z + gr[3] * x.w;
      }
    });
    sdot = dev::warp_sum(sdot);
    if (lane == 0) red[warp] = sdot;
    for (int i = warp; i < L; i += nwarp) {  // dgam from dP o P (rows +) and from r
      const float s = warp_row_sum(i, [&](int j) { return dP[i * kLa + j] * P[i * kLa + j]; });
      const float qr = warp_row_sum(Dk, [&](int d) { return ldv(qs + i * ldk + d) * X[i * ldk + d]; });
      if (lane == 0) dgam[i] += s + cs.G[i] * scale * qr;
    }
    col_sums(L, xs, [&](int j, int i) { return dP[j * kLa + i] * P[j * kLa + i]; });  // (columns -)
    __syncthreads();
    if (tid < L) {
      float x = -xs[tid];
      if (tid == last) {
        float s = 0.f;
        for (int w = 0; w < nwarp; ++w) s += red[w];
        x += glast * s;
      }
      dgam[tid] += x;
    }
    for (int idx = tid; idx < kC * kC; idx += nth) dP[(idx / kC) * kLa + idx % kC] *= decay(cs, idx / kC, idx % kC);
    __syncthreads();

    // (2)(3) dq = scale ((dP o M) K + G r), one pass over dq; (4) r2 = Dl dS^T (-> X);
    // (2)(4) dk += scale (dP o M)^T q + Ge r2
    auto dq_extra = [&](int i, int d) { return scale * cs.G[i] * X[i * ldk + d]; };
    if constexpr (kB16)
      ldm_gemm_add_global<kWide>(L, Dk, kC, f32_m(dP, kLa), kmajor(ks, ldk), f32_m(dP, kLa), kmajor(ks, ldk), false, dq,
                                 sqk, scale, dq_extra);
    else
      gemm_add_global<kSplit>(L, Dk, prod(dP, kLa, 1, ks, ldk, 1, kC), dq, sqk, scale, dq_extra);
    if constexpr (kB16) {
      stage_state_bf16(dSe, Dk, Dv, Sb);
      ldm_gemm<kWide>(L, Dk, Dv, f32_m(Y, ldv_), nmajor(Sb, lds),
               [&](int j, int d, float acc) { X[j * ldk + d] = acc; });
      __syncthreads();
    } else {
      for_state_blocks(dSe, Dk, Dv, G, ldg, [&](int d0, int nd) {
        gemm<true, kSplit>(L, nd, prod(Y, ldv_, 1, G, 1, ldg, Dv),
                           [&](int j, int d, float acc) { X[j * ldk + d0 + d] = acc; });
      });
    }
    auto dk_extra = [&](int j, int d) { return cs.Ge[j] * X[j * ldk + d]; };
    if constexpr (kB16)
      ldm_gemm_add_global<kWide>(L, Dk, kC, f32_k(dP, kLa), kmajor(qs, ldk), f32_k(dP, kLa), kmajor(qs, ldk), false, dk,
                                 sqk, scale, dk_extra);
    else
      gemm_add_global<kSplit>(L, Dk, prod(dP, 1, kLa, qs, ldk, 1, kC), dk, sqk, scale, dk_extra);

    // (4) dgam terms; dDl -> Y and v -> dO for what follows
    for (int j = warp; j < kC; j += nwarp) {
      const float kr = j < last ? warp_row_sum(Dk, [&](int d) { return ldv(ks + j * ldk + d) * X[j * ldk + d]; }) : 0.f;
      if (lane == 0) {
        const float x = cs.Ge[j] * kr;
        xs[j] = x;
        if (j < last) dgam[j] -= x;
      }
    }
    __syncthreads();  // Y (Dl) and dO are no longer read
    async_rows(Y, ldv_, p.dDl + vrow0, sv, Dv, kC, L);
    async_rows(dO, ldv_, p.v + vrow0, sv, Dv, kC, L);
    async_done();
    __syncthreads();

    // (5) dW = -dDl S0^T (-> X; rows >= L are zero since dDl's are)
    if (tid == 0) {
      float s = 0.f;
      for (int j = 0; j < kC; ++j) s += xs[j];
      dgam[last] += s;
    }
    if constexpr (kB16) {
      stage_state_bf16(S0, Dk, Dv, Sb);
      ldm_gemm<kWide>(kC, Dk, Dv, f32_m(Y, ldv_), nmajor(Sb, lds),
               [&](int i, int d, float acc) { X[i * ldk + d] = -acc; });
      __syncthreads();
    } else {
      for_state_blocks(S0, Dk, Dv, G, ldg, [&](int d0, int nd) {
        gemm<true, kSplit>(kC, nd, prod(Y, ldv_, 1, G, 1, ldg, Dv),
                           [&](int i, int d, float acc) { X[i * ldk + d0 + d] = -acc; });
      });
    }

    // (6) back substitution Y_i = dX_i - sum_{j>i} A[j,i] Y_j on X (-> YW) and Y (-> YU); U -> G
    async_rows(G, ldg, p.U + vrow0, sv, Dv, kC, L);
    for (int col = tid; col < Dk + Dv; col += nth) {  // one call site: the unrolled solve is ~2,500 instructions
      const bool in_x = col < Dk;
      bwd_subst_col<kLa>(KM, cs.bt, in_x ? X + col : Y + (col - Dk), in_x ? ldk : ldv_);
    }
    for (int i = tid; i < kC * kLa; i += nth) dP[i] = P[i] = 0.f;
    async_done();
    __syncthreads();

    // (7) dA = -(YU U^T + YW W^T), E = dA o b_i M; dv, db, dgam, dk
    gemm<true, kSplit>(kC, L, prod(Y, ldv_, 1, G, 1, ldg, Dv), [&](int i, int j, float acc) { dP[i * kLa + j] = acc; });
    __syncthreads();
    auto da_epi = [&](int i, int j, float acc) {
      const bool in = j < i && same_seg(cs, i, j);
      const float da = in ? -(dP[i * kLa + j] + acc) : 0.f;
      dP[i * kLa + j] = da;
      P[i * kLa + j] = in ? da * cs.bt[i] * decay(cs, i, j) : 0.f;
    };
    if constexpr (kB16) {
      async_rows(Sb, ldk, p.Wb + wrow0, sw, Dk, kC, L);
      async_done();
      __syncthreads();
      ldm_gemm<kWide>(kC, L, Dk, f32_m(X, ldk), nmajor(Sb, ldk), da_epi);
    } else {
      async_rows(G, ldg, p.W + wrow0, sw, Dk, kC, L);
      async_done();
      __syncthreads();
      gemm<true, kSplit>(kC, L, prod(X, ldk, 1, G, 1, ldg, Dk), da_epi);
    }
    for (int i = warp; i < L; i += nwarp) {
      const float tt = warp_row_sum(Dk, [&](int d) { return ldv(ks + i * ldk + d) * X[i * ldk + d]; });
      const float vy = warp_row_sum(Dv, [&](int e) { return ldv(dO + i * ldv_ + e) * Y[i * ldv_ + e]; });
      if (lane == 0) {
        dbt[i] += vy + cs.G[i] * tt;
        dgam[i] += cs.bt[i] * cs.G[i] * tt;
      }
    }
    float* dvh = p.dv + vrow0;
    for (int i = warp; i < L; i += nwarp)
      for (int e = lane; e < Dv; e += 32) dvh[i * sv + e] = cs.bt[i] * Y[i * ldv_ + e];
    __syncthreads();
    // the next head's dO and Dl load under (8) and (9), which read neither
    if (p.grads_prefetch && h + 1 < (kh + 1) * group) {
      async_rows(dO, ldv_, p.dout + vrow0 + Dv, sv, Dv, kC, L);
      async_rows(Y, ldv_, p.Dl + vrow0 + Dv, sv, Dv, kC, L);
      dev::cp_async_commit();
    }

    // (8) db, dgam from dA; (7)(8) dk += b G YW + E K + E^T K
    for (int i = warp; i < L; i += nwarp) {  // the row part of dgam: b_i sum_{j<i} dA[i,j] KM[i,j] = b_i db_i's term
      const float sdb = warp_row_sum(i, [&](int j) { return dP[i * kLa + j] * KM[i * kLa + j]; });
      if (lane == 0) dbt[i] += sdb, dgam[i] += cs.bt[i] * sdb;
    }
    col_sums(L, xs, [&](int j, int i) { return dP[j * kLa + i] * cs.bt[j] * KM[j * kLa + i]; });  // subtracted in (9)
    auto e_extra = [&](int i, int d) { return cs.bt[i] * cs.G[i] * X[i * ldk + d]; };
    if constexpr (kB16)
      ldm_gemm_add_global<kWide>(L, Dk, kC, f32_m(P, kLa), kmajor(ks, ldk), f32_k(P, kLa), kmajor(ks, ldk), true, dk,
                                 sqk, 1.f, e_extra);
    else
      gemm2_add_global<kSplit>(L, Dk, prod(P, kLa, 1, ks, ldk, 1, kC), prod(P, 1, kLa, ks, ldk, 1, kC), dk, sqk, 1.f,
                               e_extra);
    __syncthreads();

    // (9) dg = suffix sums of dgam within the chunk; dbeta
    if (tid == 0) {
      float suffix = 0.f;
      for (int i = L - 1; i >= 0; --i) {
        suffix += dgam[i] - xs[i];
        p.dg[(ch.t0 + i) * Hv + h] = suffix;
        p.dbeta[(ch.t0 + i) * Hv + h] = dbt[i];
      }
    }
    __syncthreads();
  }
}

}  // namespace

int64_t gdn_rule_bwd_chunked_workspace_bytes(const GdnDims& d) { return ChunkedWs(d).floats() * 4; }

void gdn_rule_bwd_chunked(const GdnDims& d, const void* qn, const void* kn, const void* v, const float* g,
                          const float* beta, const int32_t* seg, const float* state_ws, const void* dout, float* dqn,
                          float* dkn, float* dv, float* dg, float* dbeta, void* ws, cudaStream_t st) {
  LT_CUDA_REQUIRE(d.Hv < 65536, "gdn_rule_bwd: Hv must be < 65536");
  if (d.tokens() == 0) return;
  const int optin = shared_optin(), Dk = int(d.Dk), Dv = int(d.Dv);
  const int nt = choose_tile(Dv, 32, optin, [&](int n) { return ds_smem_bytes(Dk, n); });
  const int64_t ds_smem = ds_smem_bytes(Dk, nt), grads_smem = grads_smem_bytes(Dk, Dv);
  const std::string why = "gdn_rule_bwd (chunked): shared memory too small for Dk = " + std::to_string(Dk) +
                          ", Dv = " + std::to_string(Dv);
  LT_CUDA_REQUIRE(nt > 0 && grads_smem <= optin, why.c_str());
  const auto ds_kern = LT_GDN_SPLIT_KERNEL(ds_pass_kernel);
  const bool warp = warp_passes(d), b16 = warp && gdn_grads_b16_allowed() && grads_b16_fits(Dk, Dv);
  const int grads_nt = b16 ? gdn_grads_cta() : kThreads;
  const bool wide = b16 && gdn_grads_wide();
  const auto grads_kern = !b16  ? (gdn_split_products() ? chunk_grads_kernel<true, false, kThreads>
                                                        : chunk_grads_kernel<false, false, kThreads>)
                          : wide ? (grads_nt == 512   ? chunk_grads_kernel<false, true, 512, true>
                                    : grads_nt == 384 ? chunk_grads_kernel<false, true, 384, true>
                                                      : chunk_grads_kernel<false, true, kThreads, true>)
                                 : (grads_nt == 512   ? chunk_grads_kernel<false, true, 512>
                                    : grads_nt == 384 ? chunk_grads_kernel<false, true, 384>
                                                      : chunk_grads_kernel<false, true, kThreads>);
  LT_CUDA(cudaFuncSetAttribute(ds_kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ds_smem)));
  LT_CUDA(cudaFuncSetAttribute(grads_kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(grads_smem)));
  const int64_t nck = gdn_rule_num_chunks(d), qk = d.Hk * d.Dk, vd = d.Hv * d.Dv;
  for_sample_groups(d, [&](const GdnDims& s, int64_t b0) {
    const int64_t r0 = b0 * d.seq;
    ChunkedArgs a = chunked_args(s, static_cast<const bf16*>(qn) + r0 * qk, static_cast<const bf16*>(kn) + r0 * qk,
                                 static_cast<const bf16*>(v) + r0 * vd, g + r0 * d.Hv, beta + r0 * d.Hv,
                                 seg ? seg + r0 : nullptr, state_ws + b0 * nck * d.Hv * d.Dk * d.Dv, ws, nt);
    a.dout = static_cast<const bf16*>(dout) + r0 * vd;
    a.dqn = dqn + r0 * qk;
    a.dkn = dkn + r0 * qk;
    a.dv = dv + r0 * vd;
    a.dg = dg + r0 * d.Hv;
    a.dbeta = dbeta + r0 * d.Hv;
    const size_t nqk = size_t(s.tokens() * qk);
    LT_CUDA(cudaMemsetAsync(a.dqn, 0, nqk * sizeof(float), st));
    LT_CUDA(cudaMemsetAsync(a.dkn, 0, nqk * sizeof(float), st));
    if (!warp) a.Wb = a.Pb = nullptr;
    if (b16) a.W = nullptr;  // chunk_grads' bf16 path reads Wb
    launch_chunk_prep(s, a, /*bwd=*/true, st);
    if (warp) {
      launch_ds_pass_warp(s, a, st);
    } else {
      ds_kern<<<dim3(unsigned(Dv / nt), unsigned(d.Hv), unsigned(s.batch)), kThreads, size_t(ds_smem), st>>>(a);
      LT_CUDA_LAUNCH();
    }
    grads_kern<<<dim3(unsigned(nck), unsigned(d.Hk), unsigned(s.batch)), unsigned(grads_nt), size_t(grads_smem),
                 st>>>(a);
    LT_CUDA_LAUNCH();
  });
}

}  // namespace lt::cuda
