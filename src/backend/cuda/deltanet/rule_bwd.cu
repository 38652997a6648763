// Chunked gated delta rule, backward: the CPU reference's steps (1)-(9) (ops_gdn_rule_bwd.cpp) per chunk,
// chunks in reverse order, with the masks and work split of deltanet/rule.cuh. One CTA per (value tile
// e0:e0+nt, key head kh, sample b) walks the value heads of kh's group one after the other, carrying the
// tile dS [Dk, nt] of dL/dS_end. Start states S0 are read from state_ws (global, fp32).
//
// Per chunk (rows i, j < 64; S0, dS, dO, U, Dl, dDl restricted to the tile's columns; "partial" = a sum
// over the tile's columns only, completed across tiles by rule_bwd_finish_kernel):
//   Dl   = U - W S0                                   (U, W recomputed exactly as in the forward)
//   dDl  = P^T dO + diag(Ge) K dS                                         (1)
//   dP   = dO Dl^T (partial)   -> dgam, and dq~ += (dP o M) K, dk += (dP o M)^T q~         (2)
//   r    = dO S0^T (partial)   -> dq~ += G r, dgam_i += G_i q~_i.r_i                      (3)
//   dgam_last += G_last <S0, dS>; r2 = Dl dS^T -> dk += diag(Ge) r2, dgam += Ge (k.r2) terms (4)
//   dS0  = G_last dS + Q~^T diag(G) dO - W^T dDl;  dW = -dDl S0^T (partial)               (4)(5)
//   YU = (I+A)^-T dDl, YW = (I+A)^-T dW   (back substitution)                              (6)
//   dA = -(YU U^T + YW W^T) (j < i); dv = diag(b) YU; db, dgam, dk from YW, YU             (7)
//   E = dA o b_i M: dk += E K + E^T K; db += (dA o KK M) 1; dgam += (dA o A) terms         (8)
//   dg = suffix sums of dgam within the chunk (in the finishing kernel)                    (9)
// Partial outputs: dq, dk [tile, T, Hk, Dk] (or dqn/dkn directly when there is one tile; scaled by 1/sqrt(Dk)
// for dq already), dgam, db [tile, T, Hv].
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/deltanet/deltanet.h"
#include "backend/cuda/deltanet/rule.cuh"

namespace lt::cuda {
namespace {
using namespace gdn;

struct BwdArgs {
  const bf16 *q, *k, *v;
  const float *g, *beta;
  const int32_t* seg;
  const float* states;
  const bf16* dout;
  float *dqp, *dkp;   // [ntile, T, Hk, Dk] (+= ; zeroed by the launcher)
  float *dgp, *dbp;   // [ntile, T, Hv] (written)
  float* dv;          // [T, Hv, Dv] (written)
  int64_t seq, nck, T;
  int Hk, Hv, Dk, Dv, nt;
  float scale;
};

int64_t bwd_smem_bytes(int Dk, int nt) {
  return carve_bytes(1, sizeof(ChunkScal)) + carve_bytes(int64_t(Dk) * nt, 4) /*dS*/ +
         2 * carve_bytes(int64_t(kC) * Dk, 4) /*W, X*/ + 3 * carve_bytes(int64_t(kC) * nt, 4) /*U, Dl, dD*/ +
         3 * carve_bytes(kC * kC, 4) /*KM, P, dP*/ + carve_bytes(2 * kC + 16, 4) /*xs, red*/ +
         2 * carve_bytes(int64_t(kC) * Dk, 2) /*qs, ks*/ + carve_bytes(int64_t(kC) * nt, 2) /*dO*/;
}

// The Mma and Simt backward: comparison variants (GdnRuleImpl; the default Chunked backward is
// deltanet/rule_bwd_chunked.cu).
// Length: one kernel body on purpose. Its stages (marked by the comments inside) share register-resident fragments
// and accumulators (the chunk's state gradient and its gate and beta partial sums) and the shared-memory pipeline's
// stage indices; split into functions they would pass those arrays by reference across every call (kept in registers
// only when all of it inlines) and read no clearer than the numbered stage comments do.
template <bool kMma>
__global__ void __launch_bounds__(kThreads) rule_bwd_kernel(BwdArgs p) {
  extern __shared__ __align__(16) char smem[];
  const int Dk = p.Dk, nt = p.nt, Hv = p.Hv, Hk = p.Hk, Dv = p.Dv, group = Hv / Hk;
  const int tile = blockIdx.x, kh = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int e0 = tile * nt, tid = threadIdx.x, nth = blockDim.x;
  const float scale = p.scale;
  Carve cv{smem};
  ChunkScal& cs = *cv.take<ChunkScal>(1);
  float* dS = cv.take<float>(int64_t(Dk) * nt);  // [Dk, nt]
  float* W = cv.take<float>(int64_t(kC) * Dk);   // [64, Dk]
  float* X = cv.take<float>(int64_t(kC) * Dk);   // [64, Dk]: r, r2, dW -> YW
  float* U = cv.take<float>(int64_t(kC) * nt);   // [64, nt]
  float* Dl = cv.take<float>(int64_t(kC) * nt);  // [64, nt]
  float* dD = cv.take<float>(int64_t(kC) * nt);  // [64, nt]: dDl -> YU
  float* KM = cv.take<float>(kC * kC);           // KK o M, j < i
  float* P = cv.take<float>(kC * kC);            // scale QK o M, j <= i; later E
  float* dP = cv.take<float>(kC * kC);           // dP -> dP o M -> dA
  float* xs = cv.take<float>(2 * kC + 16);       // xs[64], red[...]
  float* red = xs + kC;
  bf16* qs = cv.take<bf16>(int64_t(kC) * Dk);
  bf16* ks = cv.take<bf16>(int64_t(kC) * Dk);
  bf16* dO = cv.take<bf16>(int64_t(kC) * nt);
  float* dqp = p.dqp + int64_t(tile) * p.T * Hk * Dk;
  float* dkp = p.dkp + int64_t(tile) * p.T * Hk * Dk;
  const int warp = tid / 32, lane = tid % 32, nwarp = nth / 32;

  for (int h = kh * group; h < (kh + 1) * group; ++h) {
    for (int i = tid; i < Dk * nt; i += nth) dS[i] = 0.f;
    for (int64_t c = p.nck - 1; c >= 0; --c) {
      const int64_t s0 = c * kC, t0 = b * p.seq + s0;
      const int L = int((p.seq - s0 < kC ? p.seq - s0 : int64_t(kC))), last = L - 1;
      const bool zero_start = chunk_zero_start(p.seg, t0, s0);
      const float* S0 = p.states + ((b * p.nck + c) * Hv + h) * int64_t(Dk) * Dv + e0;  // S0(d, e) = S0[d*Dv + e]
      auto qkrow = [&](int i) { return ((t0 + i) * Hk + kh) * int64_t(Dk); };
      auto vrow = [&](int i) { return ((t0 + i) * Hv + h) * int64_t(Dv) + e0; };
      for (int idx = tid; idx < kC * Dk; idx += nth) {
        const int i = idx / Dk, d = idx % Dk;
        const bool ok = i < L;
        qs[idx] = ok ? p.q[qkrow(i) + d] : __float2bfloat16(0.f);
        ks[idx] = ok ? p.k[qkrow(i) + d] : __float2bfloat16(0.f);
      }
      for (int idx = tid; idx < kC * nt; idx += nth) {
        const int i = idx / nt, e = idx % nt;
        dO[idx] = i < L ? p.dout[vrow(i) + e] : __float2bfloat16(0.f);
      }
      load_chunk_scalars(cs, p.g, p.beta, p.seg, t0, L, Hv, h);  // syncs
      const float glast = cs.G[last];
      float dgam = 0.f, dbt = 0.f;  // row tid's dgam, db (threads < 64)

      // ---- recompute A (as KM), P, W, U, Dl
      for (int idx = tid; idx < kC * Dk; idx += nth) W[idx] = cs.bt[idx / Dk] * cs.G[idx / Dk] * ldv(ks + idx);
      for (int idx = tid; idx < kC * nt; idx += nth) {
        const int i = idx / nt, e = idx % nt;
        U[idx] = i < L ? cs.bt[i] * ldv(p.v + vrow(i) + e) : 0.f;
      }
      gemm2<kMma>(kC, kC, prod(ks, Dk, 1, ks, 1, Dk, Dk), prod(qs, Dk, 1, ks, 1, Dk, Dk),
                [&](int i, int j, float kk, float qk) {
                  const float m = decay(cs, i, j);
                  KM[i * kC + j] = j < i ? kk * m : 0.f;
                  P[i * kC + j] = scale * qk * m;
                });
      __syncthreads();
      for (int col = tid; col < Dk + nt; col += nth) {  // forward substitution, A[i,j] = b_i KM[i,j]
        float* Xc = col < Dk ? W + col : U + (col - Dk);
        const int ld = col < Dk ? Dk : nt;
        if constexpr (kMma) {
          fwd_subst_col(KM, cs.bt, Xc, ld);
        } else {
          for (int i = 1; i < L; ++i) {
            float x = Xc[i * ld];
            const float bi = cs.bt[i];
            for (int j = 0; j < i; ++j) x -= bi * KM[i * kC + j] * Xc[j * ld];
            Xc[i * ld] = x;
          }
        }
      }
      __syncthreads();
      gemm<kMma>(kC, nt, prod(W, Dk, 1, S0, Dv, 1, Dk),
               [&](int i, int e, float acc) { Dl[i * nt + e] = U[i * nt + e] - acc; });
      __syncthreads();

      // ---- (1) dDl, dP = dO Dl^T, r = dO S0^T
      gemm2<kMma>(kC, nt, prod(P, 1, kC, dO, nt, 1, kC), prod(ks, Dk, 1, dS, nt, 1, Dk),
                [&](int j, int e, float a1, float a2) { dD[j * nt + e] = a1 + cs.Ge[j] * a2; });
      gemm<kMma>(kC, kC, prod(dO, nt, 1, Dl, 1, nt, nt), [&](int i, int j, float acc) { dP[i * kC + j] = acc; });
      gemm<kMma>(kC, Dk, prod(dO, nt, 1, S0, 1, Dv, nt), [&](int i, int d, float acc) { X[i * Dk + d] = acc; });
      __syncthreads();

      // ---- (2) dgam from dP o P; (3) dgam, dq from r; (4) <S0, dS>
      if (tid < kC) {
        const int i = tid;
        float s = 0.f;
        for (int j = 0; j < i; ++j) s += dP[i * kC + j] * P[i * kC + j];
        for (int r = i + 1; r < kC; ++r) s -= dP[r * kC + i] * P[r * kC + i];
        float qr = 0.f;
        for (int d = 0; d < Dk; ++d) qr += ldv(qs + i * Dk + d) * X[i * Dk + d];
        dgam += s + cs.G[i] * scale * qr;
      }
      for (int idx = tid; idx < L * Dk; idx += nth) {
        const int i = idx / Dk, d = idx % Dk;
        dqp[qkrow(i) + d] += scale * cs.G[i] * X[idx];
      }
      {
        float s = 0.f;
        for (int idx = tid; idx < Dk * nt; idx += nth) s += S0[int64_t(idx / nt) * Dv + idx % nt] * dS[idx];
        s = dev::warp_sum(s);
        if (lane == 0) red[warp] = s;
      }
      __syncthreads();
      // dP -> dP o M (j <= i)
      for (int idx = tid; idx < kC * kC; idx += nth) dP[idx] *= decay(cs, idx / kC, idx % kC);
      if (tid == last) {
        float s = 0.f;
        for (int w = 0; w < nwarp; ++w) s += red[w];
        dgam += glast * s;
      }
      __syncthreads();

      // ---- (2) dq~ += (dP o M) K, dk += (dP o M)^T q~;  (4) r2 = Dl dS^T
      gemm<kMma>(kC, Dk, prod(dP, kC, 1, ks, Dk, 1, kC), [&](int i, int d, float acc) {
        if (i < L) dqp[qkrow(i) + d] += scale * acc;
      });
      gemm<kMma>(kC, Dk, prod(dP, 1, kC, qs, Dk, 1, kC), [&](int j, int d, float acc) {
        if (j < L) dkp[qkrow(j) + d] += scale * acc;
      });
      gemm<kMma>(kC, Dk, prod(Dl, nt, 1, dS, 1, nt, nt), [&](int j, int d, float acc) { X[j * Dk + d] = acc; });
      __syncthreads();

      // ---- (4) dk += Ge r2, dgam terms; dS0 = G_last dS + Q~^T diag(G) dO - W^T dDl
      for (int idx = tid; idx < L * Dk; idx += nth) {
        const int j = idx / Dk, d = idx % Dk;
        dkp[qkrow(j) + d] += cs.Ge[j] * X[idx];
      }
      if (tid < kC) {
        const int j = tid;
        float kr = 0.f;
        for (int d = 0; d < Dk; ++d) kr += ldv(ks + j * Dk + d) * X[j * Dk + d];
        const float x = cs.Ge[j] * kr;
        xs[j] = j < last ? x : 0.f;
        if (j < last) dgam -= x;
      }
      gemm2<kMma>(Dk, nt, prod(qs, 1, Dk, dO, nt, 1, kC, cs.G), prod(W, 1, Dk, dD, nt, 1, kC),
                [&](int d, int e, float a1, float a2) {
                  dS[d * nt + e] = glast * dS[d * nt + e] + scale * a1 - a2;
                });
      __syncthreads();

      // ---- (5) dW = -dDl S0^T
      if (tid == last) {
        float s = 0.f;
        for (int j = 0; j < kC; ++j) s += xs[j];
        dgam += s;
      }
      gemm<kMma>(kC, Dk, prod(dD, nt, 1, S0, 1, Dv, nt), [&](int i, int d, float acc) { X[i * Dk + d] = -acc; });
      __syncthreads();

      // ---- (6) back substitution Y_i = dX_i - sum_{j>i} A[j,i] Y_j on X (-> YW) and dD (-> YU)
      for (int col = tid; col < Dk + nt; col += nth) {
        float* Xc = col < Dk ? X + col : dD + (col - Dk);
        const int ld = col < Dk ? Dk : nt;
        if constexpr (kMma) {
          bwd_subst_col(KM, cs.bt, Xc, ld);
        } else {
          for (int i = L - 2; i >= 0; --i) {
            float y = Xc[i * ld];
            for (int j = i + 1; j < L; ++j) y -= cs.bt[j] * KM[j * kC + i] * Xc[j * ld];
            Xc[i * ld] = y;
          }
        }
      }
      __syncthreads();

      // ---- (6) dA = -(YU U^T + YW W^T), E = dA o b_i M;  (7) dv, db, dgam, dk
      gemm2<kMma>(kC, kC, prod(dD, nt, 1, U, 1, nt, nt), prod(X, Dk, 1, W, 1, Dk, Dk),
                [&](int i, int j, float a1, float a2) {
                  const bool in = j < i && same_seg(cs, i, j);
                  const float da = in ? -(a1 + a2) : 0.f;
                  dP[i * kC + j] = da;
                  P[i * kC + j] = in ? da * cs.bt[i] * decay(cs, i, j) : 0.f;
                });
      if (tid < L) {
        const int i = tid;
        float tt = 0.f, vy = 0.f;
        for (int d = 0; d < Dk; ++d) tt += ldv(ks + i * Dk + d) * X[i * Dk + d];
        for (int e = 0; e < nt; ++e) vy += ldv(p.v + vrow(i) + e) * dD[i * nt + e];
        dbt += vy + cs.G[i] * tt;
        dgam += cs.bt[i] * cs.G[i] * tt;
      }
      for (int idx = tid; idx < L * nt; idx += nth) {
        const int i = idx / nt, e = idx % nt;
        p.dv[vrow(i) + e] = cs.bt[i] * dD[idx];
      }
      for (int idx = tid; idx < L * Dk; idx += nth) {
        const int i = idx / Dk, d = idx % Dk;
        dkp[qkrow(i) + d] += cs.bt[i] * cs.G[i] * X[idx];
      }
      __syncthreads();

      // ---- (8) db, dgam from dA; dk += E K + E^T K
      if (tid < kC) {
        const int i = tid;
        float sdb = 0.f, sg = 0.f;
        for (int j = 0; j < i; ++j) {
          sdb += dP[i * kC + j] * KM[i * kC + j];
          sg += dP[i * kC + j] * cs.bt[i] * KM[i * kC + j];
        }
        for (int r = i + 1; r < kC; ++r) sg -= dP[r * kC + i] * cs.bt[r] * KM[r * kC + i];
        dbt += sdb;
        dgam += sg;
      }
      gemm2<kMma>(kC, Dk, prod(P, kC, 1, ks, Dk, 1, kC), prod(P, 1, kC, ks, Dk, 1, kC),
                [&](int i, int d, float a1, float a2) {
                  if (i < L) dkp[qkrow(i) + d] += a1 + a2;
                });
      if (tid < L) {
        const int64_t o = (int64_t(tile) * p.T + t0 + tid) * Hv + h;
        p.dgp[o] = dgam;
        p.dbp[o] = dbt;
      }
      if (zero_start)
        for (int i = tid; i < Dk * nt; i += nth) dS[i] = 0.f;
      __syncthreads();
    }
  }
}

// dg = suffix sums within each chunk of sum_tile dgp; dbeta = sum_tile dbp. Thread per (sample, chunk, head).
__global__ void rule_bwd_gates_finish(const float* dgp, const float* dbp, int64_t batch, int64_t seq, int64_t nck,
                                      int64_t T, int Hv, int ntile, float* dg, float* dbeta) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= batch * nck * Hv) return;
  const int h = int(idx % Hv);
  const int64_t c = (idx / Hv) % nck, b = idx / (Hv * nck);
  const int64_t s0 = c * kC, L = (seq - s0 < kC ? seq - s0 : int64_t(kC)), t0 = b * seq + s0;
  float suffix = 0.f;
  for (int64_t i = L - 1; i >= 0; --i) {
    float sg = 0.f, sb = 0.f;
    for (int tl = 0; tl < ntile; ++tl) {
      const int64_t o = (tl * T + t0 + i) * Hv + h;
      sg += dgp[o];
      sb += dbp[o];
    }
    suffix += sg;
    dg[(t0 + i) * Hv + h] = suffix;
    dbeta[(t0 + i) * Hv + h] = sb;
  }
}

// out[i] = sum_tile part[tile * n + i].
__global__ void rule_bwd_sum_tiles(const float* part, int64_t n, int ntile, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.f;
  for (int tl = 0; tl < ntile; ++tl) s += part[tl * n + i];
  out[i] = s;
}

struct BwdPlan {
  int nt = 0, ntile = 0;
  int64_t smem = 0;
};
BwdPlan bwd_plan(const GdnDims& d) {
  int dev = 0, optin = 0;
  LT_CUDA(cudaGetDevice(&dev));
  LT_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  BwdPlan pl;
  pl.nt = choose_tile(int(d.Dv), 64, optin, [&](int n) { return bwd_smem_bytes(int(d.Dk), n); });
  LT_CUDA_REQUIRE(pl.nt > 0, "gdn_rule_bwd: shared memory too small for this Dk");
  pl.ntile = int(d.Dv) / pl.nt;
  pl.smem = bwd_smem_bytes(int(d.Dk), pl.nt);
  return pl;
}

// Workspace layout: dgp, dbp [ntile, T, Hv]; then (ntile > 1) dqp, dkp [ntile, T, Hk, Dk].
int64_t ws_gates_floats(const GdnDims& d, int ntile) { return int64_t(ntile) * d.tokens() * d.Hv; }
int64_t ws_qk_floats(const GdnDims& d, int ntile) {
  return ntile > 1 ? int64_t(ntile) * d.tokens() * d.Hk * d.Dk : 0;
}

}  // namespace

int64_t gdn_rule_bwd_workspace_bytes(const GdnDims& d) {
  LT_CUDA_REQUIRE(gdn_dims_supported(d), "gdn_rule_bwd: unsupported shape (see gdn_dims_supported)");
  const BwdPlan pl = bwd_plan(d);
  const int64_t tiled = (2 * ws_gates_floats(d, pl.ntile) + 2 * ws_qk_floats(d, pl.ntile)) * 4;
  return std::max<int64_t>({16, tiled, gdn_rule_bwd_chunked_workspace_bytes(d)});
}

void gdn_rule_bwd(const GdnDims& d, const void* qn, const void* kn, const void* v, const float* g, const float* beta,
                  const int32_t* seg, const float* state_ws, const void* dout, float* dqn, float* dkn, float* dv,
                  float* dg, float* dbeta, void* ws, cudaStream_t st) {
  LT_CUDA_REQUIRE(gdn_dims_supported(d), "gdn_rule_bwd: unsupported shape (see gdn_dims_supported)");
  LT_CUDA_REQUIRE(d.batch < 65536 && d.Hk < 65536, "gdn_rule_bwd: batch and Hk must be < 65536");
  const int64_t T = d.tokens();
  if (T == 0) return;
  if (gdn_rule_impl() == GdnRuleImpl::Chunked) {
    gdn_rule_bwd_chunked(d, qn, kn, v, g, beta, seg, state_ws, dout, dqn, dkn, dv, dg, dbeta, ws, st);
    return;
  }
  const BwdPlan pl = bwd_plan(d);
  float* base = static_cast<float*>(ws);
  float* dgp = base;
  float* dbp = dgp + ws_gates_floats(d, pl.ntile);
  float* dqp = pl.ntile > 1 ? dbp + ws_gates_floats(d, pl.ntile) : dqn;
  float* dkp = pl.ntile > 1 ? dqp + ws_qk_floats(d, pl.ntile) : dkn;
  const int64_t nqk = T * d.Hk * d.Dk;
  LT_CUDA(cudaMemsetAsync(dqp, 0, size_t(pl.ntile * nqk) * sizeof(float), st));
  LT_CUDA(cudaMemsetAsync(dkp, 0, size_t(pl.ntile * nqk) * sizeof(float), st));
  auto kernel = gdn_rule_impl() == GdnRuleImpl::Mma ? rule_bwd_kernel<true> : rule_bwd_kernel<false>;
  LT_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(pl.smem)));
  const int64_t nck = gdn_rule_num_chunks(d);
  BwdArgs a{static_cast<const bf16*>(qn), static_cast<const bf16*>(kn), static_cast<const bf16*>(v), g, beta, seg,
            state_ws, static_cast<const bf16*>(dout), dqp, dkp, dgp, dbp, dv, d.seq, nck, T, int(d.Hk), int(d.Hv),
            int(d.Dk), int(d.Dv), pl.nt, float(1.0 / std::sqrt(double(d.Dk)))};
  kernel<<<dim3(unsigned(pl.ntile), unsigned(d.Hk), unsigned(d.batch)), kThreads, size_t(pl.smem), st>>>(a);
  LT_CUDA_LAUNCH();
  const int64_t nfin = d.batch * nck * d.Hv;
  rule_bwd_gates_finish<<<unsigned((nfin + 127) / 128), 128, 0, st>>>(dgp, dbp, d.batch, d.seq, nck, T, int(d.Hv),
                                                                      pl.ntile, dg, dbeta);
  LT_CUDA_LAUNCH();
  if (pl.ntile > 1) {
    rule_bwd_sum_tiles<<<unsigned((nqk + 255) / 256), 256, 0, st>>>(dqp, nqk, pl.ntile, dqn);
    LT_CUDA_LAUNCH();
    rule_bwd_sum_tiles<<<unsigned((nqk + 255) / 256), 256, 0, st>>>(dkp, nqk, pl.ntile, dkn);
    LT_CUDA_LAUNCH();
  }
}

}  // namespace lt::cuda
