// One Gated DeltaNet decode step per sequence: the conv output from the conv state, the q/k norm, the gates and
// the delta-rule update of the recurrent state, then the conv window's shift (the CPU reference:
// cpu::gdn_conv_silu_step and the recurrent rule in src/backend/cpu/ops_gdn_recurrent.cpp).
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/deltanet/row_common.cuh"

namespace lt::cuda {
namespace {
using namespace dev;
using namespace gdn_rows;

// Block (sequence n, value head h), blockDim >= max(Dk, Dv), multiple of 32 (<= 128). The conv outputs of
// the channels this head reads are recomputed from conv_state (not modified here; conv_shift_kernel
// updates it afterwards). Thread e < Dv owns column e of the state.
// Row n's states are those of batch slot slots[n] (slots == nullptr: slot n).
__global__ void decode_rule_kernel(const bf16* qkv, int64_t ldx, const bf16* w, const bf16* a, const bf16* b,
                                   const bf16* A_log, const bf16* dt_bias, const float* conv_state, float* rec_state,
                                   int Hk, int Hv, int Dk, int Dv, int K, const int32_t* slots, bf16* o) {
  __shared__ float qs[128], ks[128], red[2][4];
  const int64_t n = blockIdx.x, sn = slots ? int64_t(slots[n]) : n;
  const int h = blockIdx.y, kh = h / (Hv / Hk), tid = threadIdx.x;
  const int64_t C = int64_t(2) * Hk * Dk + int64_t(Hv) * Dv;
  auto conv = [&](int64_t c) {
    const float* sc = conv_state + (sn * C + c) * (K - 1);
    float acc = 0.f;
    for (int i = 0; i < K - 1; ++i) acc += ldf(w + c * K + i) * sc[i];
    acc += ldf(w + c * K + K - 1) * ldf(qkv + n * ldx + c);
    return acc * sigm(acc);
  };
  float qv = 0.f, kv = 0.f, vv = 0.f;
  if (tid < Dk) {
    qv = conv(int64_t(kh) * Dk + tid);
    kv = conv(int64_t(Hk) * Dk + int64_t(kh) * Dk + tid);
  }
  if (tid < Dv) vv = conv(int64_t(2) * Hk * Dk + int64_t(h) * Dv + tid);
  float sq = warp_sum(qv * qv), sk = warp_sum(kv * kv);
  if (tid % 32 == 0) red[0][tid / 32] = sq, red[1][tid / 32] = sk;
  __syncthreads();
  sq = 0.f, sk = 0.f;
  for (int i = 0; i < int(blockDim.x / 32); ++i) sq += red[0][i], sk += red[1][i];
  const float scale = rsqrtf(float(Dk));
  if (tid < Dk) {
    qs[tid] = qv * rsqrtf(sq + kL2Eps) * scale;
    ks[tid] = kv * rsqrtf(sk + kL2Eps);
  }
  __syncthreads();
  const float z = ldf(a + n * Hv + h) + ldf(dt_bias + h);
  const float gdec = expf(-expf(ldf(A_log + h)) * softplus(z)), bt = sigm(ldf(b + n * Hv + h));
  if (tid >= Dv) return;
  float* S = rec_state + (sn * Hv + h) * int64_t(Dk) * Dv + tid;
  float u = 0.f;
  for (int d = 0; d < Dk; ++d) u += (gdec * S[int64_t(d) * Dv]) * ks[d];
  const float delta = bt * (vv - u);
  float acc = 0.f;
  for (int d = 0; d < Dk; ++d) {
    const float s = gdec * S[int64_t(d) * Dv] + ks[d] * delta;
    S[int64_t(d) * Dv] = s;
    acc += s * qs[d];
  }
  o[(n * Hv + h) * Dv + tid] = __float2bfloat16(acc);
}

__global__ void conv_shift_kernel(const bf16* qkv, int64_t ldx, int64_t n, int64_t C, int K, const int32_t* slots,
                                  float* conv_state) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * C || K < 2) return;
  const int64_t r = idx / C, c = idx % C, sr = slots ? int64_t(slots[r]) : r;
  float* sc = conv_state + (sr * C + c) * (K - 1);
  for (int i = 0; i + 1 < K - 1; ++i) sc[i] = sc[i + 1];
  sc[K - 2] = ldf(qkv + r * ldx + c);
}

}  // namespace

void gdn_decode_step(const GdnDims& d, const void* qkv, int64_t ldx, const void* w_conv, const void* a, const void* b,
                     const void* A_log, const void* dt_bias, float* conv_state, float* rec_state, void* o,
                     cudaStream_t st, const int32_t* slots) {
  check_dims(d);
  LT_CUDA_REQUIRE(d.seq == 1, "gdn_decode_step: seq must be 1");
  const int64_t n = d.batch, C = d.conv_ch();
  LT_CUDA_REQUIRE(ldx >= C, "gdn_decode_step: ldx < conv channels");
  if (n == 0) return;
  const int threads = int(std::max(d.Dk, d.Dv) + 31) / 32 * 32;
  decode_rule_kernel<<<dim3(unsigned(n), unsigned(d.Hv)), threads, 0, st>>>(
      B(qkv), ldx, B(w_conv), B(a), B(b), B(A_log), B(dt_bias), conv_state, rec_state, int(d.Hk), int(d.Hv),
      int(d.Dk), int(d.Dv), int(d.K), slots, Bm(o));
  LT_CUDA_LAUNCH();
  if (d.K >= 2) {
    conv_shift_kernel<<<nblocks(n * C, 256), 256, 0, st>>>(B(qkv), ldx, n, C, int(d.K), slots, conv_state);
    LT_CUDA_LAUNCH();
  }
}

}  // namespace lt::cuda
