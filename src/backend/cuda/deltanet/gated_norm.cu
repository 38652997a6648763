// Gated DeltaNet output norm, forward and backward: RMSNorm of each head's output times SiLU(z) (the CPU
// reference: src/backend/cpu/ops_gdn_recurrent.cpp); dw reduced deterministically through per-warp partials.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/deltanet/row_common.cuh"

namespace lt::cuda {
namespace {
using namespace dev;
using namespace gdn_rows;

constexpr int kNormVecs = 64;  // vectors per warp of the gated-norm backward

// Vector vec = t Hv + h of z (and dz): row t of stride ldz, head h. 32-bit division (the host checks
// nvec < 2^31): the 64-bit one cost the forward ~20 %.
__device__ __forceinline__ int64_t zoff(int64_t vec, int Hv, int Dv, int64_t ldz) {
  const unsigned v = unsigned(vec), t = v / unsigned(Hv);
  return int64_t(t) * ldz + int64_t(v - t * unsigned(Hv)) * Dv;
}

// One warp per vector of Dv (<= 128: each lane holds <= 4 entries).
__global__ void gnorm_fwd_kernel(const bf16* o, const bf16* z, int Hv, int64_t ldz, const bf16* w, int64_t nvec,
                                 int Dv, float eps, bf16* out, float* rstd) {
  const int64_t vec = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (vec >= nvec) return;
  const bf16* x = o + vec * Dv;
  float ss = 0.f;
  for (int i = lane; i < Dv; i += 32) ss += ldf(x + i) * ldf(x + i);
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / float(Dv) + eps);
  if (lane == 0) rstd[vec] = r;
  for (int i = lane; i < Dv; i += 32) {
    const float zv = ldf(z + zoff(vec, Hv, Dv, ldz) + i);
    out[vec * Dv + i] = __float2bfloat16(ldf(w + i) * (ldf(x + i) * r) * (zv * sigm(zv)));
  }
}

// n = x r; dn = dy w silu(z); dx = r (dn - n mean(dn n)); dz = dy w n silu'(z); dw partial per warp.
__global__ void gnorm_bwd_kernel(const bf16* o, const bf16* z, int Hv, int64_t ldz, const bf16* w, const float* rstd,
                                 const bf16* dout, int64_t nvec, int Dv, bf16* dx, bf16* dz, float* partial) {
  const int64_t gw = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // global warp
  const int lane = threadIdx.x % 32;
  const int64_t v0 = gw * kNormVecs;
  float dwacc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t vec = v0; vec < min(nvec, v0 + kNormVecs); ++vec) {
    const float r = rstd[vec];
    const int64_t zo = zoff(vec, Hv, Dv, ldz);
    float dot = 0.f;
    for (int i = lane; i < Dv; i += 32) {
      const float zv = ldf(z + zo + i), n = ldf(o + vec * Dv + i) * r;
      dot += ldf(dout + vec * Dv + i) * ldf(w + i) * (zv * sigm(zv)) * n;
    }
    dot = warp_sum(dot);
    const float c = dot / float(Dv);
    for (int i = lane, k = 0; i < Dv; i += 32, ++k) {
      const float zv = ldf(z + zo + i), s = sigm(zv), n = ldf(o + vec * Dv + i) * r;
      const float dyv = ldf(dout + vec * Dv + i), dyw = dyv * ldf(w + i);
      dx[vec * Dv + i] = __float2bfloat16(r * (dyw * (zv * s) - n * c));
      dz[zo + i] = __float2bfloat16(dyw * n * (s * (1.f + zv * (1.f - s))));
      dwacc[k] += dyv * n * (zv * s);
    }
  }
  if (v0 < nvec)
    for (int i = lane, k = 0; i < Dv; i += 32, ++k) partial[gw * Dv + i] = dwacc[k];
}

// The same two kernels with each lane holding 4 consecutive entries of a vector (8-byte loads and stores, every
// input read once; Dv a multiple of 4, at most 128 * NV). The scalar ones read 2 bytes a lane a load (measured:
// 0.17 / 0.45 ms at the 27B shape, several times their bytes' time).
// a[k] <- entries 4 lane + 128 k (those < Dv) of vector vec of p (rows of Dv).
template <int NV>
__device__ __forceinline__ void ld_vec4(const bf16* p, int64_t vec, int Dv, float (&a)[NV][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (4 * lane + 128 * k < Dv) ld4(p + vec * Dv + 4 * lane + 128 * k, a[k]);
}
template <int NV>
__global__ void gnorm_fwd_vec4_kernel(const bf16* o, const bf16* z, int Hv, int64_t ldz, const bf16* w, int64_t nvec,
                                      int Dv, float eps, bf16* out, float* rstd) {
  const int64_t vec = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (vec >= nvec) return;
  float x[NV][4], zv[NV][4];
  ld_vec4(o, vec, Dv, x);
  ld_vec4(z + zoff(vec, Hv, Dv, ldz), 0, Dv, zv);
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (4 * lane + 128 * k < Dv)
#pragma unroll
      for (int e = 0; e < 4; ++e) ss += x[k][e] * x[k][e];
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / float(Dv) + eps);
  if (lane == 0) rstd[vec] = r;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i = 4 * lane + 128 * k;
    if (i < Dv) {
      float wv[4], y[4];
      ld4(w + i, wv);
#pragma unroll
      for (int e = 0; e < 4; ++e) y[e] = wv[e] * (x[k][e] * r) * (zv[k][e] * sigm(zv[k][e]));
      st4(out + vec * Dv + i, y);
    }
  }
}
template <int NV>
__global__ void gnorm_bwd_vec4_kernel(const bf16* o, const bf16* z, int Hv, int64_t ldz, const bf16* w,
                                      const float* rstd, const bf16* dout, int64_t nvec, int Dv, bf16* dx, bf16* dz,
                                      float* partial) {
  const int64_t gw = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // global warp
  const int lane = threadIdx.x % 32;
  const int64_t v0 = gw * kNormVecs;
  if (v0 >= nvec) return;
  float wv[NV][4], dwacc[NV][4];
#pragma unroll
  for (int k = 0; k < NV; ++k)
#pragma unroll
    for (int e = 0; e < 4; ++e) wv[k][e] = dwacc[k][e] = 0.f;
  ld_vec4(w, 0, Dv, wv);
  for (int64_t vec = v0; vec < min(nvec, v0 + kNormVecs); ++vec) {
    const float r = rstd[vec];
    const int64_t zo = zoff(vec, Hv, Dv, ldz);
    float x[NV][4], zv[NV][4], dy[NV][4];
    ld_vec4(o, vec, Dv, x);
    ld_vec4(z + zo, 0, Dv, zv);
    ld_vec4(dout, vec, Dv, dy);
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (4 * lane + 128 * k < Dv)
#pragma unroll
        for (int e = 0; e < 4; ++e) dot += dy[k][e] * wv[k][e] * (zv[k][e] * sigm(zv[k][e])) * (x[k][e] * r);
    dot = warp_sum(dot);
    const float c = dot / float(Dv);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int i = 4 * lane + 128 * k;
      if (i < Dv) {
        float gx[4], gz[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float zz = zv[k][e], s = sigm(zz), n = x[k][e] * r, dyw = dy[k][e] * wv[k][e];
          gx[e] = r * (dyw * (zz * s) - n * c);
          gz[e] = dyw * n * (s * (1.f + zz * (1.f - s)));
          dwacc[k][e] += dy[k][e] * n * (zz * s);
        }
        st4(dx + vec * Dv + i, gx);
        st4(dz + zo + i, gz);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i = 4 * lane + 128 * k;
    if (i < Dv)
#pragma unroll
      for (int e = 0; e < 4; ++e) partial[gw * Dv + i + e] = dwacc[k][e];
  }
}

// Whether the vec4 kernels take these pointers and Dv (8-byte aligned vectors, at most 256 entries).
bool gnorm_vec4(int Dv, std::initializer_list<const void*> ptrs) {
  if (Dv % 4 != 0 || Dv > 256) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 8 != 0) return false;
  return true;
}

}  // namespace

void gdn_gated_norm_fwd(const GdnDims& d, const void* o, const void* z, int64_t ldz, const void* w, float eps,
                        void* out, float* rstd, cudaStream_t st) {
  check_dims(d);
  LT_CUDA_REQUIRE(ldz >= d.Hv * d.Dv, "gdn_gated_norm_fwd: ldz < value heads x head dim");
  const int64_t nvec = d.tokens() * d.Hv;
  if (nvec == 0) return;
  LT_CUDA_REQUIRE(nvec < (int64_t(1) << 31), "gdn_gated_norm_fwd: rows x value heads >= 2^31");
  const int Dv = int(d.Dv), Hv = int(d.Hv);
  const bool v4 = gnorm_vec4(Dv, {o, z, w, out}) && ldz % 4 == 0;
  if (v4 && Dv <= 128)
    gnorm_fwd_vec4_kernel<1><<<nblocks(nvec, 8), 256, 0, st>>>(B(o), B(z), Hv, ldz, B(w), nvec, Dv, eps, Bm(out),
                                                                rstd);
  else if (v4)
    gnorm_fwd_vec4_kernel<2><<<nblocks(nvec, 8), 256, 0, st>>>(B(o), B(z), Hv, ldz, B(w), nvec, Dv, eps, Bm(out),
                                                                rstd);
  else
    gnorm_fwd_kernel<<<nblocks(nvec, 8), 256, 0, st>>>(B(o), B(z), Hv, ldz, B(w), nvec, Dv, eps, Bm(out), rstd);
  LT_CUDA_LAUNCH();
}

int64_t gdn_gated_norm_bwd_workspace_bytes(const GdnDims& d) {
  const int64_t nwarp = std::max<int64_t>(1, (d.tokens() * d.Hv + kNormVecs - 1) / kNormVecs);
  return nwarp * d.Dv * int64_t(sizeof(float));
}

void gdn_gated_norm_bwd(const GdnDims& d, const void* o, const void* z, int64_t ldz, const void* w, float eps,
                        const float* rstd, const void* dout, void* do_, void* dz, float* dw, void* ws,
                        cudaStream_t st) {
  (void)eps;  // rstd from the forward already holds 1/sqrt(mean(o^2) + eps)
  check_dims(d);
  LT_CUDA_REQUIRE(ldz >= d.Hv * d.Dv, "gdn_gated_norm_bwd: ldz < value heads x head dim");
  const int64_t nvec = d.tokens() * d.Hv;
  if (nvec == 0) return;
  LT_CUDA_REQUIRE(nvec < (int64_t(1) << 31), "gdn_gated_norm_bwd: rows x value heads >= 2^31");
  const int64_t nwarp = (nvec + kNormVecs - 1) / kNormVecs;
  float* partial = static_cast<float*>(ws);
  const int Dv = int(d.Dv), Hv = int(d.Hv);
  const bool v4 = gnorm_vec4(Dv, {o, z, w, dout, do_, dz}) && ldz % 4 == 0;
  if (v4 && Dv <= 128)
    gnorm_bwd_vec4_kernel<1><<<nblocks(nwarp, 8), 256, 0, st>>>(B(o), B(z), Hv, ldz, B(w), rstd, B(dout), nvec, Dv,
                                                                 Bm(do_), Bm(dz), partial);
  else if (v4)
    gnorm_bwd_vec4_kernel<2><<<nblocks(nwarp, 8), 256, 0, st>>>(B(o), B(z), Hv, ldz, B(w), rstd, B(dout), nvec, Dv,
                                                                 Bm(do_), Bm(dz), partial);
  else
    gnorm_bwd_kernel<<<nblocks(nwarp, 8), 256, 0, st>>>(B(o), B(z), Hv, ldz, B(w), rstd, B(dout), nvec, Dv, Bm(do_),
                                                        Bm(dz), partial);
  LT_CUDA_LAUNCH();
  partial_finish(partial, nwarp, d.Dv, dw, st);
}

}  // namespace lt::cuda
