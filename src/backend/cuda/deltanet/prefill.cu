// Gated DeltaNet decoding state after a packed prefill pass (deltanet.h, gdn_prefill_state): the conv
// windows and the recurrent states of the prompts, from what the training kernels computed over the pass
// (the pre-conv projections, the prep outputs and the chunked rule's chunk-start states).
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/deltanet/deltanet.h"

namespace lt::cuda {
namespace {
using bf16 = __nv_bfloat16;

__device__ __forceinline__ int64_t first_row(const int64_t* last_rows, int64_t p) {
  return p == 0 ? 0 : last_rows[p - 1] + 1;
}

// One thread per (prompt p, channel c, window column j): window[j] = qkv[e - (K-2) + j, c], zero before the
// prompt's first row (e = last_rows[p]).
__global__ void prefill_conv_kernel(const bf16* qkv, int64_t ldx, const int64_t* last_rows, const int32_t* slots,
                                    int64_t n, int64_t C, int K, float* conv_state) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, W = K - 1;
  if (idx >= n * C * W) return;
  const int64_t p = idx / (C * W), c = (idx / W) % C, j = idx % W;
  const int64_t e = last_rows[p], t = e - (W - 1) + j;
  const float x = t >= first_row(last_rows, p) ? __bfloat162float(qkv[t * ldx + c]) : 0.f;
  conv_state[(int64_t(slots[p]) * C + c) * W + j] = x;
}

// Block (prompt p, value head h), blockDim a multiple of 32 >= max(Dk, Dv) (<= 128); thread e < Dv owns
// column e of S [Dk, Dv] (kept in place in the slot's recurrent state). From the start state (the chunk-start
// state of the chunk holding the prompt's last row when the prompt began at or before that chunk, else zero),
// per row t: decay = exp(g_t); u = decay S^T k_t; S = decay S + k_t (beta_t (v_t - u))^T.
__global__ void prefill_rule_kernel(const bf16* kn, const bf16* v, const float* g, const float* beta,
                                    const float* chunk_states, const int64_t* last_rows, const int32_t* slots, int Hk,
                                    int Hv, int Dk, int Dv, float* rec_state) {
  __shared__ float ks[128];
  const int64_t p = blockIdx.x;
  const int h = blockIdx.y, kh = h / (Hv / Hk), tid = threadIdx.x;
  const int64_t e = last_rows[p], s0 = first_row(last_rows, p), c0 = e / kGdnChunk * kGdnChunk;
  const int64_t hsz = int64_t(Dk) * Dv;
  float* S = rec_state + (int64_t(slots[p]) * Hv + h) * hsz;
  const float* S0 = chunk_states + ((c0 / kGdnChunk) * Hv + h) * hsz;
  const bool from_chunk = s0 <= c0;
  if (tid < Dv)
    for (int d = 0; d < Dk; ++d) S[int64_t(d) * Dv + tid] = from_chunk ? S0[int64_t(d) * Dv + tid] : 0.f;
  for (int64_t t = from_chunk ? c0 : s0; t <= e; ++t) {
    __syncthreads();  // the previous row's ks are consumed
    if (tid < Dk) ks[tid] = __bfloat162float(kn[(t * Hk + kh) * Dk + tid]);
    __syncthreads();
    if (tid >= Dv) continue;
    const float decay = expf(g[t * Hv + h]), bt = beta[t * Hv + h];
    float u = 0.f;
    for (int d = 0; d < Dk; ++d) u += (decay * S[int64_t(d) * Dv + tid]) * ks[d];
    const float delta = bt * (__bfloat162float(v[(t * Hv + h) * Dv + tid]) - u);
    for (int d = 0; d < Dk; ++d) S[int64_t(d) * Dv + tid] = decay * S[int64_t(d) * Dv + tid] + ks[d] * delta;
  }
}

}  // namespace

void gdn_prefill_state(const GdnDims& d, int64_t n, const int64_t* last_rows, const int32_t* slots, const void* qkv,
                       int64_t ldx, const void* kn, const void* v, const float* g, const float* beta,
                       const float* chunk_states, float* conv_state, float* rec_state, cudaStream_t st) {
  LT_CUDA_REQUIRE(gdn_dims_supported(d) && d.batch == 1, "gdn_prefill_state: unsupported shape (batch must be 1)");
  LT_CUDA_REQUIRE(ldx >= d.conv_ch(), "gdn_prefill_state: ldx < conv channels");
  LT_CUDA_REQUIRE(n < 65536, "gdn_prefill_state: too many prompts in one pass");
  if (n == 0) return;
  const int64_t C = d.conv_ch(), W = d.K - 1;
  if (W > 0) {
    const int64_t total = n * C * W;
    prefill_conv_kernel<<<unsigned((total + 255) / 256), 256, 0, st>>>(
        static_cast<const bf16*>(qkv), ldx, last_rows, slots, n, C, int(d.K), conv_state);
    LT_CUDA_LAUNCH();
  }
  const int threads = int((std::max(d.Dk, d.Dv) + 31) / 32 * 32);
  prefill_rule_kernel<<<dim3(unsigned(n), unsigned(d.Hv)), threads, 0, st>>>(
      static_cast<const bf16*>(kn), static_cast<const bf16*>(v), g, beta, chunk_states, last_rows, slots, int(d.Hk),
      int(d.Hv), int(d.Dk), int(d.Dv), rec_state);
  LT_CUDA_LAUNCH();
}

}  // namespace lt::cuda
