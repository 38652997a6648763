// Chunked gated delta rule, forward (the CPU reference's ops_gdn_rule.cpp algorithm; see deltanet/rule.cuh
// for the work split and the masks). Per chunk of L <= 64 rows, one CTA (value tile e0:e0+nt, head h,
// sample b), state tile S [Dk, nt] fp32 in shared memory:
//   A[i,j]  = b_i (k_i.k_j) M[i,j]  (j < i),     P[i,j] = scale (q_i.k_j) M[i,j]  (j <= i)
//   W = (I+A)^-1 diag(b G) K,  U = (I+A)^-1 diag(b) V      (forward substitution, column by column)
//   Dl = U - W S0
//   o_i = scale G_i S0^T q_i + sum_j P[i,j] Dl_j
//   S_end = G_last S0 + K^T diag(Ge) Dl
// S0 is stored to state_ws before the chunk is processed.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/deltanet/deltanet.h"
#include "backend/cuda/deltanet/rule.cuh"
#include "backend/cuda/kernel_options.h"

namespace lt::cuda {
namespace {
using namespace gdn;

struct FwdArgs {
  const bf16 *q, *k, *v;
  const float *g, *beta;
  const int32_t* seg;
  bf16* o;
  float* states;
  int64_t seq, nck;
  int Hk, Hv, Dk, Dv, nt;
  float scale;
};

int64_t fwd_smem_bytes(int Dk, int nt) {
  return carve_bytes(1, sizeof(ChunkScal)) + carve_bytes(int64_t(Dk) * nt, 4) + carve_bytes(int64_t(kC) * Dk, 4) +
         2 * carve_bytes(int64_t(kC) * nt, 4) + 2 * carve_bytes(kC * kC, 4) + 2 * carve_bytes(int64_t(kC) * Dk, 2);
}

// kMma: the Mma forward (the decoder's prefill, which passes no workspace); !kMma: Simt, a comparison variant.
template <bool kMma>
__global__ void __launch_bounds__(kThreads) rule_fwd_kernel(FwdArgs p) {
  extern __shared__ __align__(16) char smem[];
  const int Dk = p.Dk, nt = p.nt, Hv = p.Hv, Hk = p.Hk, Dv = p.Dv;
  const int tile = blockIdx.x, h = blockIdx.y, kh = h / (Hv / Hk);
  const int64_t b = blockIdx.z;
  const int e0 = tile * nt, tid = threadIdx.x, nth = blockDim.x;
  Carve cv{smem};
  ChunkScal& cs = *cv.take<ChunkScal>(1);
  float* S = cv.take<float>(int64_t(Dk) * nt);   // [Dk, nt]
  float* W = cv.take<float>(int64_t(kC) * Dk);   // [64, Dk]
  float* UD = cv.take<float>(int64_t(kC) * nt);  // [64, nt]: U, then Dl
  float* Ot = cv.take<float>(int64_t(kC) * nt);  // [64, nt]: scale G_i S0^T q_i
  float* A = cv.take<float>(kC * kC);            // [64, 64]
  float* P = cv.take<float>(kC * kC);            // [64, 64]
  bf16* qs = cv.take<bf16>(int64_t(kC) * Dk);    // [64, Dk]
  bf16* ks = cv.take<bf16>(int64_t(kC) * Dk);

  for (int i = tid; i < Dk * nt; i += nth) S[i] = 0.f;
  for (int64_t c = 0; c < p.nck; ++c) {
    const int64_t s0 = c * kC, t0 = b * p.seq + s0;
    const int L = int((p.seq - s0 < kC ? p.seq - s0 : int64_t(kC)));
    const bool zero_start = chunk_zero_start(p.seg, t0, s0);
    for (int idx = tid; idx < kC * Dk; idx += nth) {
      const int i = idx / Dk, d = idx % Dk;
      const bool ok = i < L;
      const int64_t src = ((t0 + i) * Hk + kh) * Dk + d;
      qs[idx] = ok ? p.q[src] : __float2bfloat16(0.f);
      ks[idx] = ok ? p.k[src] : __float2bfloat16(0.f);
    }
    float* st = p.states + ((b * p.nck + c) * Hv + h) * int64_t(Dk) * Dv + e0;
    for (int idx = tid; idx < Dk * nt; idx += nth) {
      const int d = idx / nt, e = idx % nt;
      if (zero_start) S[idx] = 0.f;
      st[int64_t(d) * Dv + e] = S[idx];
    }
    load_chunk_scalars(cs, p.g, p.beta, p.seg, t0, L, Hv, h);  // syncs
    // W, U right-hand sides; A and P.
    for (int idx = tid; idx < kC * Dk; idx += nth) {
      const int i = idx / Dk;
      W[idx] = cs.bt[i] * cs.G[i] * ldv(ks + idx);
    }
    for (int idx = tid; idx < kC * nt; idx += nth) {
      const int i = idx / nt, e = idx % nt;
      UD[idx] = i < L ? cs.bt[i] * ldv(p.v + ((t0 + i) * Hv + h) * int64_t(Dv) + e0 + e) : 0.f;
    }
    gemm2<kMma>(kC, kC, prod(ks, Dk, 1, ks, 1, Dk, Dk), prod(qs, Dk, 1, ks, 1, Dk, Dk),
              [&](int i, int j, float kk, float qk) {
                const float m = decay(cs, i, j);
                A[i * kC + j] = j < i ? cs.bt[i] * kk * m : 0.f;
                P[i * kC + j] = p.scale * qk * m;
              });
    __syncthreads();
    // Forward substitution X_i -= sum_{j<i} A[i,j] X_j on every column of W and U (a thread per column).
    for (int col = tid; col < Dk + nt; col += nth) {
      float* X = col < Dk ? W + col : UD + (col - Dk);
      const int ld = col < Dk ? Dk : nt;
      if constexpr (kMma) {
        fwd_subst_col(A, nullptr, X, ld);
      } else {
        for (int i = 1; i < L; ++i) {
          float x = X[i * ld];
          for (int j = 0; j < i; ++j) x -= A[i * kC + j] * X[j * ld];
          X[i * ld] = x;
        }
      }
    }
    __syncthreads();
    // Dl = U - W S0;  Ot = scale G_i q_i S0.
    gemm2<kMma>(kC, nt, prod(W, Dk, 1, S, nt, 1, Dk), prod(qs, Dk, 1, S, nt, 1, Dk),
              [&](int i, int e, float ws, float qsv) {
                UD[i * nt + e] -= ws;
                Ot[i * nt + e] = p.scale * cs.G[i] * qsv;
              });
    __syncthreads();
    // o = Ot + P Dl;  S = G_last S + K^T diag(Ge) Dl  (independent outputs: one phase).
    gemm<kMma>(kC, nt, prod(P, kC, 1, UD, nt, 1, kC), [&](int i, int e, float acc) {
      if (i < L) p.o[((t0 + i) * Hv + h) * int64_t(Dv) + e0 + e] = __float2bfloat16(Ot[i * nt + e] + acc);
    });
    const float glast = cs.G[L - 1];
    gemm<kMma>(Dk, nt, prod(ks, 1, Dk, UD, nt, 1, kC, cs.Ge),
             [&](int d, int e, float acc) { S[d * nt + e] = glast * S[d * nt + e] + acc; });
    __syncthreads();
  }
}

}  // namespace

// The choices of KernelOptions (kernel_options.h), read at each launch.
GdnRuleImpl gdn_rule_impl() { return kernel_options().gdn_rule; }
// gdn_rule_fwd = Mma: the Chunked implementation runs the Mma forward (same chunk states) with its backward.
static bool chunked_forward() { return kernel_options().gdn_rule_fwd == GdnRuleFwd::Chunked; }
const char* gdn_rule_impl_name(GdnRuleImpl impl) {
  return impl == GdnRuleImpl::Chunked ? "chunked" : impl == GdnRuleImpl::Mma ? "mma" : "simt";
}

// Bf16 by default: measured faster at the same HF parity.
GdnRulePrecision gdn_rule_precision() { return kernel_options().gdn_precision; }
const char* gdn_rule_precision_name(GdnRulePrecision p) { return p == GdnRulePrecision::Split ? "split" : "bf16"; }
bool gdn_split_products() { return gdn_rule_precision() == GdnRulePrecision::Split; }
// The register passes unless gdn_passes = Tile (measured: rule 2.27 / 10.88 ms against the tile passes' 4.66 / 12.97).
bool gdn_warp_passes_allowed() { return kernel_options().gdn_passes == GdnPasses::Warp; }
bool gdn_grads_b16_allowed() { return kernel_options().gdn_grads == GdnGrads::Bf16; }
int gdn_grads_cta() { return kernel_options().gdn_grads_cta; }
// Measured at the 27B shape, batch 8 (H200): the rule's backward 7.34 ms at 256 threads and 16 x 16 tiles, 6.38 ms at 512 and
// 16 x 32 (more warps to hide the latencies of a kernel that holds one CTA per SM by its shared memory).
bool gdn_grads_wide() { return kernel_options().gdn_grads_tile == 32; }
int gdn_sched_flags() {
  switch (kernel_options().gdn_sched) {
    case GdnSched::None: return 0;
    case GdnSched::Prep: return 1;
    case GdnSched::Grads: return 2;
    default: return 3;
  }
}

int64_t gdn_rule_num_chunks(const GdnDims& d) { return (d.seq + kGdnChunk - 1) / kGdnChunk; }

int64_t gdn_rule_state_bytes(const GdnDims& d) {
  return d.batch * gdn_rule_num_chunks(d) * d.Hv * d.Dk * d.Dv * int64_t(sizeof(float));
}

int64_t gdn_rule_fwd_workspace_bytes(const GdnDims& d) {
  LT_CUDA_REQUIRE(gdn_dims_supported(d), "gdn_rule_fwd: unsupported shape (see gdn_dims_supported)");
  return gdn_rule_fwd_chunked_workspace_bytes(d);
}

void gdn_rule_fwd(const GdnDims& d, const void* qn, const void* kn, const void* v, const float* g, const float* beta,
                  const int32_t* seg, void* o, float* state_ws, cudaStream_t st, void* ws) {
  static_assert(kGdnChunk == kC, "chunk length");
  LT_CUDA_REQUIRE(gdn_dims_supported(d), "gdn_rule_fwd: unsupported shape (see gdn_dims_supported)");
  if (ws && gdn_rule_impl() == GdnRuleImpl::Chunked && chunked_forward()) {
    gdn_rule_fwd_chunked(d, qn, kn, v, g, beta, seg, o, state_ws, ws, st);
    return;
  }
  LT_CUDA_REQUIRE(d.batch < 65536 && d.Hv < 65536, "gdn_rule_fwd: batch and Hv must be < 65536");
  if (d.tokens() == 0) return;
  int dev = 0, optin = 0;
  LT_CUDA(cudaGetDevice(&dev));
  LT_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const int Dk = int(d.Dk), Dv = int(d.Dv);
  const int nt = choose_tile(Dv, 64, optin, [&](int n) { return fwd_smem_bytes(Dk, n); });
  LT_CUDA_REQUIRE(nt > 0, "gdn_rule_fwd: shared memory too small for this Dk");
  const int64_t smem = fwd_smem_bytes(Dk, nt);
  const bool mma = gdn_rule_impl() != GdnRuleImpl::Simt;  // Chunked runs the Mma forward
  auto kernel = mma ? rule_fwd_kernel<true> : rule_fwd_kernel<false>;
  LT_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  FwdArgs a{static_cast<const bf16*>(qn), static_cast<const bf16*>(kn), static_cast<const bf16*>(v), g, beta, seg,
            static_cast<bf16*>(o), state_ws, d.seq, gdn_rule_num_chunks(d), int(d.Hk), int(d.Hv), Dk, Dv, nt,
            float(1.0 / std::sqrt(double(Dk)))};
  kernel<<<dim3(unsigned(Dv / nt), unsigned(d.Hv), unsigned(d.batch)), kThreads, size_t(smem), st>>>(a);
  LT_CUDA_LAUNCH();
}

}  // namespace lt::cuda
