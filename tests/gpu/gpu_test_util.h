// Helpers for the GPU tests: device buffers, bf16 round trips, error metrics, random data.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace lt::gputest {

#define GT_CUDA(call)                                                                 \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_);            \
  } while (0)

inline size_t sz(int64_t v) { return static_cast<size_t>(v); }

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define REQUIRE_GPU() \
  if (!::lt::gputest::have_gpu()) GTEST_SKIP() << "no GPU"

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  explicit DevBuf(size_t b) : bytes(b) {
    if (cudaMalloc(&p, b ? b : 1) != cudaSuccess) p = nullptr;
    cudaMemset(p, 0xFF, b);  // poison: NaN in bf16/fp32, so unwritten outputs fail comparisons
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  template <typename T> T* as() const { return static_cast<T*>(p); }
};

inline std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.f, float mean = 0.f) {
  std::normal_distribution<float> d(mean, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
inline std::vector<float> round_bf16(std::vector<float> v) {
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}
inline DevBuf up_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
  DevBuf d(h.size() * 2);
  cudaMemcpy(d.p, h.data(), h.size() * 2, cudaMemcpyHostToDevice);
  return d;
}
template <typename T>
inline DevBuf up(const std::vector<T>& v) {
  DevBuf d(v.size() * sizeof(T));
  cudaMemcpy(d.p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}
inline std::vector<float> down_bf16(const void* d, size_t n) {
  std::vector<uint16_t> h(n);
  cudaDeviceSynchronize();
  cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = bf16_to_f32(h[i]);
  return v;
}
template <typename T>
inline std::vector<T> down(const void* d, size_t n) {
  std::vector<T> v(n);
  cudaDeviceSynchronize();
  cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

// ||a - ref|| / ||ref|| (NaN anywhere -> inf).
inline double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double dd = 0, rr = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    dd += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    rr += double(ref[i]) * ref[i];
  }
  return rr == 0 ? std::sqrt(dd) : std::sqrt(dd / rr);
}
inline double cosine(const float* a, const float* b, size_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return -2;
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  if (aa == 0 && bb == 0) return 1;
  return ab / std::sqrt(aa * bb);
}

}  // namespace lt::gputest
