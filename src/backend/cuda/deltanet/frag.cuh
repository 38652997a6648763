// Internal to the Gated DeltaNet rule kernels that read bf16 shared tiles with ldmatrix (deltanet/rule_pass_warp.cu,
// the lean chunk_prep): mma.m16n8k16 fragment loads for each tile orientation, accumulator -> A-operand reuse.
// Fragment layout (PTX, lane = 4 g + t): C (16 x 8) holds rows g, g+8 x columns 2t, 2t+1; an A fragment (16 x 16)
// is two C tiles side by side; B (16 x 8) holds k rows 2t, 2t+1 (and + 8) x column g.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/dev_common.cuh"

namespace lt::cuda::gdn {

using dev::bf16;

// A (m x k = 16 x 16) from a bf16 tile stored [m][k] (k contiguous), rows m0.., columns k0...
__device__ __forceinline__ void lda_mmajor(uint32_t (&a)[4], const bf16* t, int ld, int m0, int k0) {
  const int l = threadIdx.x & 31;
  dev::ldmatrix_x4(a, t + (m0 + (l & 7) + ((l >> 3) & 1) * 8) * ld + k0 + (l >> 4) * 8);
}
// A (m x k = 16 x 16) from a bf16 tile stored [k][m] (m contiguous), rows k0.., columns m0...
__device__ __forceinline__ void lda_kmajor(uint32_t (&a)[4], const bf16* t, int ld, int m0, int k0) {
  const int l = threadIdx.x & 31;
  dev::ldmatrix_x4_trans(a, t + (k0 + (l & 7) + (l >> 4) * 8) * ld + m0 + ((l >> 3) & 1) * 8);
}
// B for two n8 tiles (n0.., n0+8..; k0..k0+16) from a tile stored [n][k] (k contiguous): b[0..1] the first
// tile's registers, b[2..3] the second's.
__device__ __forceinline__ void ldb_nmajor(uint32_t (&b)[4], const bf16* t, int ld, int n0, int k0) {
  const int l = threadIdx.x & 31;
  dev::ldmatrix_x4(b, t + (n0 + (l & 7) + (l >> 4) * 8) * ld + k0 + ((l >> 3) & 1) * 8);
}
// The same from a tile stored [k][n] (n contiguous).
__device__ __forceinline__ void ldb_kmajor(uint32_t (&b)[4], const bf16* t, int ld, int n0, int k0) {
  const int l = threadIdx.x & 31;
  dev::ldmatrix_x4_trans(b, t + (k0 + (l & 7) + ((l >> 3) & 1) * 8) * ld + n0 + (l >> 4) * 8);
}
// A fragment for k-step kk from accumulator tiles C[2kk], C[2kk+1], column c scaled by sc(c) (c = 16 kk + 2t ..).
template <int N, typename Scale>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&C)[N][4], int kk, Scale sc) {
  const int t = threadIdx.x & 3, c0 = 16 * kk + 2 * t;
  const float s0 = sc(c0), s1 = sc(c0 + 1), s2 = sc(c0 + 8), s3 = sc(c0 + 9);
  a[0] = dev::pack_bf16(C[2 * kk][0] * s0, C[2 * kk][1] * s1);
  a[1] = dev::pack_bf16(C[2 * kk][2] * s0, C[2 * kk][3] * s1);
  a[2] = dev::pack_bf16(C[2 * kk + 1][0] * s2, C[2 * kk + 1][1] * s3);
  a[3] = dev::pack_bf16(C[2 * kk + 1][2] * s2, C[2 * kk + 1][3] * s3);
}
// C[2j], C[2j+1] += a x (b[0..1], b[2..3]).
template <int N>
__device__ __forceinline__ void mma_pair(float (&C)[N][4], int j, const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  dev::mma_bf16(C[2 * j], a, b[0], b[1]);
  dev::mma_bf16(C[2 * j + 1], a, b[2], b[3]);
}
// For each accumulator element of tiles C[0 .. N): f(row r (0..15 within the warp's block), column c, value&).
template <int N, typename F>
__device__ __forceinline__ void for_acc(float (&C)[N][4], F f) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) f(g + (i >> 1) * 8, 8 * j + 2 * t + (i & 1), C[j][i]);
}

}  // namespace lt::cuda::gdn
