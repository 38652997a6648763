// Gated DeltaNet "prep", forward and backward: the fused q/k L2 norm, the v copy and the gates
// g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b) (the CPU reference: src/backend/cpu/ops_gdn_recurrent.cpp).
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/deltanet/row_common.cuh"

namespace lt::cuda {
namespace {
using namespace dev;
using namespace gdn_rows;

constexpr int kGateRows = 64;  // rows per block of the gates backward

// One block per row t. Warps take the 2*Hk q/k vectors; then v copy and gates.
__global__ void prep_fwd_kernel(const bf16* y, const bf16* a, const bf16* b, int64_t ldab, const bf16* A_log,
                                const bf16* dt_bias, int Hk, int Hv, int Dk, int Dv, bf16* qn, bf16* kn, bf16* v,
                                float* g, float* beta) {
  const int64_t t = blockIdx.x;
  const int64_t C = int64_t(2) * Hk * Dk + int64_t(Hv) * Dv;
  const bf16* yr = y + t * C;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  for (int vec = warp; vec < 2 * Hk; vec += nw) {
    const bf16* src = yr + int64_t(vec) * Dk;
    float ss = 0.f;
    for (int i = lane; i < Dk; i += 32) ss += ldf(src + i) * ldf(src + i);
    ss = warp_sum(ss);
    const float r = rsqrtf(ss + kL2Eps);
    bf16* dst = vec < Hk ? qn + (t * Hk + vec) * Dk : kn + (t * Hk + (vec - Hk)) * Dk;
    for (int i = lane; i < Dk; i += 32) dst[i] = __float2bfloat16(ldf(src + i) * r);
  }
  const bf16* vs = yr + int64_t(2) * Hk * Dk;
  for (int i = threadIdx.x; i < Hv * Dv; i += blockDim.x) v[t * Hv * Dv + i] = vs[i];
  for (int h = threadIdx.x; h < Hv; h += blockDim.x) {
    const float z = ldf(a + t * ldab + h) + ldf(dt_bias + h);
    g[t * Hv + h] = -expf(ldf(A_log + h)) * softplus(z);
    beta[t * Hv + h] = sigm(ldf(b + t * ldab + h));
  }
}

// dx = r dy - r^3 x (x . dy) per q/k vector; dv copied; per row t.
__global__ void prep_bwd_rows_kernel(const bf16* y, const float* dqn, const float* dkn, const float* dv, int Hk, int Hv,
                                     int Dk, int Dv, bf16* dy) {
  const int64_t t = blockIdx.x;
  const int64_t C = int64_t(2) * Hk * Dk + int64_t(Hv) * Dv;
  const bf16* yr = y + t * C;
  bf16* dyr = dy + t * C;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  for (int vec = warp; vec < 2 * Hk; vec += nw) {
    const bf16* xs = yr + int64_t(vec) * Dk;
    const float* gs = vec < Hk ? dqn + (t * Hk + vec) * Dk : dkn + (t * Hk + (vec - Hk)) * Dk;
    float ss = 0.f, xd = 0.f;
    for (int i = lane; i < Dk; i += 32) {
      const float xv = ldf(xs + i);
      ss += xv * xv;
      xd += xv * gs[i];
    }
    ss = warp_sum(ss);
    xd = warp_sum(xd);
    const float r = rsqrtf(ss + kL2Eps), c = r * r * r * xd;
    for (int i = lane; i < Dk; i += 32) dyr[int64_t(vec) * Dk + i] = __float2bfloat16(r * gs[i] - c * ldf(xs + i));
  }
  for (int i = threadIdx.x; i < Hv * Dv; i += blockDim.x)
    dyr[int64_t(2) * Hk * Dk + i] = __float2bfloat16(dv[t * Hv * Dv + i]);
}

// Block = rows [blk*kGateRows, ...), thread = head: da, db written; partial [blk][2][Hv] (dA_log, ddt_bias).
// a, b, da, db: row stride ldab; dg, dbeta dense [T, Hv].
__global__ void prep_bwd_gates_kernel(const bf16* a, const bf16* b, int64_t ldab, const bf16* A_log,
                                      const bf16* dt_bias, const float* dg, const float* dbeta, int64_t T, int Hv,
                                      bf16* da, bf16* db, float* partial) {
  const int64_t t0 = int64_t(blockIdx.x) * kGateRows, t1 = min(T, t0 + kGateRows);
  for (int h = threadIdx.x; h < Hv; h += blockDim.x) {
    const float e = expf(ldf(A_log + h)), bias = ldf(dt_bias + h);
    float sa = 0.f, sb = 0.f;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i = t * Hv + h, j = t * ldab + h;
      const float z = ldf(a + j) + bias;
      const float dz = dg[i] * (-e * softplus_grad(z));
      da[j] = __float2bfloat16(dz);
      sb += dz;
      sa += dg[i] * (-e * softplus(z));
      const float s = sigm(ldf(b + j));
      db[j] = __float2bfloat16(dbeta[i] * (s * (1.f - s)));
    }
    partial[(int64_t(blockIdx.x) * 2 + 0) * Hv + h] = sa;
    partial[(int64_t(blockIdx.x) * 2 + 1) * Hv + h] = sb;
  }
}

// dA_log[h] += sum_blk partial[blk][0][h]; ddt_bias[h] += ... [1][h].
__global__ void gates_finish_kernel(const float* partial, int64_t nblk, int Hv, float* dA_log, float* ddt_bias) {
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= Hv) return;
  float sa = 0.f, sb = 0.f;
  for (int64_t s = 0; s < nblk; ++s) sa += partial[(s * 2) * Hv + h], sb += partial[(s * 2 + 1) * Hv + h];
  dA_log[h] += sa;
  ddt_bias[h] += sb;
}

// prep_fwd_kernel with 4-entry loads and stores of the q/k vectors (a lane per 4 entries) and 16-byte copies of v
// (Dk, Dv multiples of 8; y, qn, kn, v 16-byte aligned). The 2-byte accesses kept the scalar kernel at ~1.8x its
// bytes' time (0.18 ms at the 27B shape).
__global__ void prep_fwd_vec_kernel(const bf16* y, const bf16* a, const bf16* b, int64_t ldab, const bf16* A_log,
                                    const bf16* dt_bias, int Hk, int Hv, int Dk, int Dv, bf16* qn, bf16* kn, bf16* v,
                                    float* g, float* beta) {
  const int64_t t = blockIdx.x;
  const int64_t C = int64_t(2) * Hk * Dk + int64_t(Hv) * Dv;
  const bf16* yr = y + t * C;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  for (int vec = warp; vec < 2 * Hk; vec += nw) {
    const bf16* src = yr + int64_t(vec) * Dk;
    float x[4][4];  // entries 4 lane + 128 k (Dk <= 128: k = 0 only; the loop keeps larger ones correct)
    float ss = 0.f;
    for (int i = 4 * lane, k = 0; i < Dk; i += 128, ++k) {
      ld4(src + i, x[k & 3]);
#pragma unroll
      for (int e = 0; e < 4; ++e) ss += x[k & 3][e] * x[k & 3][e];
    }
    ss = warp_sum(ss);
    const float r = rsqrtf(ss + kL2Eps);
    bf16* dst = vec < Hk ? qn + (t * Hk + vec) * Dk : kn + (t * Hk + (vec - Hk)) * Dk;
    for (int i = 4 * lane, k = 0; i < Dk; i += 128, ++k) {
      float o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] = x[k & 3][e] * r;
      st4(dst + i, o);
    }
  }
  const uint4* vs = reinterpret_cast<const uint4*>(yr + int64_t(2) * Hk * Dk);
  uint4* vd = reinterpret_cast<uint4*>(v + t * Hv * Dv);
  for (int i = threadIdx.x; i < Hv * Dv / 8; i += blockDim.x) vd[i] = vs[i];
  for (int h = threadIdx.x; h < Hv; h += blockDim.x) {
    const float z = ldf(a + t * ldab + h) + ldf(dt_bias + h);
    g[t * Hv + h] = -expf(ldf(A_log + h)) * softplus(z);
    beta[t * Hv + h] = sigm(ldf(b + t * ldab + h));
  }
}

}  // namespace

void gdn_prep_fwd(const GdnDims& d, const void* y, const void* a, const void* b, int64_t ldab, const void* A_log,
                  const void* dt_bias, void* qn, void* kn, void* v, float* g, float* beta, cudaStream_t st) {
  check_dims(d);
  const int64_t T = d.tokens();
  LT_CUDA_REQUIRE(ldab >= d.Hv, "gdn_prep_fwd: ldab < value heads");
  if (T == 0) return;
  LT_CUDA_REQUIRE(T < (int64_t(1) << 31), "gdn_prep_fwd: too many rows");
  const bool vec = d.Dk <= 512 && aligned16(y) && aligned16(qn) && aligned16(kn) && aligned16(v);
  (vec ? prep_fwd_vec_kernel : prep_fwd_kernel)<<<unsigned(T), 256, 0, st>>>(
      B(y), B(a), B(b), ldab, B(A_log), B(dt_bias), int(d.Hk), int(d.Hv), int(d.Dk), int(d.Dv), Bm(qn), Bm(kn), Bm(v),
      g, beta);
  LT_CUDA_LAUNCH();
}

int64_t gdn_prep_bwd_workspace_bytes(const GdnDims& d) {
  const int64_t nblk = std::max<int64_t>(1, (d.tokens() + kGateRows - 1) / kGateRows);
  return nblk * 2 * d.Hv * int64_t(sizeof(float));
}

void gdn_prep_bwd(const GdnDims& d, const void* y, const void* a, const void* b, int64_t ldab, const void* A_log,
                  const void* dt_bias, const float* dqn, const float* dkn, const float* dv, const float* dg,
                  const float* dbeta, void* dy, void* da, void* db, float* dA_log, float* ddt_bias, void* ws,
                  cudaStream_t st) {
  check_dims(d);
  const int64_t T = d.tokens();
  LT_CUDA_REQUIRE(ldab >= d.Hv, "gdn_prep_bwd: ldab < value heads");
  if (T == 0) return;
  LT_CUDA_REQUIRE(T < (int64_t(1) << 31), "gdn_prep_bwd: too many rows");
  prep_bwd_rows_kernel<<<unsigned(T), 256, 0, st>>>(B(y), dqn, dkn, dv, int(d.Hk), int(d.Hv), int(d.Dk), int(d.Dv),
                                                    Bm(dy));
  LT_CUDA_LAUNCH();
  const int64_t nblk = (T + kGateRows - 1) / kGateRows;
  float* partial = static_cast<float*>(ws);
  prep_bwd_gates_kernel<<<unsigned(nblk), 64, 0, st>>>(B(a), B(b), ldab, B(A_log), B(dt_bias), dg, dbeta, T,
                                                       int(d.Hv), Bm(da), Bm(db), partial);
  LT_CUDA_LAUNCH();
  gates_finish_kernel<<<nblocks(d.Hv, 64), 64, 0, st>>>(partial, nblk, int(d.Hv), dA_log, ddt_bias);
  LT_CUDA_LAUNCH();
}

}  // namespace lt::cuda
