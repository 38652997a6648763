// Timed sgemm wrapper and linear layers (y = x W^T + b) through OpenBLAS.
#include <cblas.h>

#include <atomic>
#include <chrono>

#include "backend/cpu/ops.h"

namespace lt::cpu {

namespace {
std::atomic<int64_t> g_gemm_ns{0};
std::atomic<int64_t> g_gemm_calls{0};
std::atomic<double> g_gemm_flops{0};
}  // namespace

GemmStats gemm_stats() {
  GemmStats s;
  s.seconds = double(g_gemm_ns.load()) * 1e-9;
  s.flops = g_gemm_flops.load();
  s.calls = g_gemm_calls.load();
  return s;
}

void reset_gemm_stats() {
  g_gemm_ns = 0;
  g_gemm_calls = 0;
  g_gemm_flops = 0;
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  auto t0 = std::chrono::steady_clock::now();
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(m), int(n),
              int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
  auto t1 = std::chrono::steady_clock::now();
  g_gemm_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
  g_gemm_calls += 1;
  double f = 2.0 * double(m) * double(n) * double(k), cur = g_gemm_flops.load();
  while (!g_gemm_flops.compare_exchange_weak(cur, cur + f)) {
  }
}

void linear_fwd(const float* x, const float* w, const float* b, int64_t n, int64_t in, int64_t out, float* y) {
  sgemm(false, true, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
  if (b) {
#pragma omp parallel for schedule(static) if (n * out > 65536)
    for (int64_t r = 0; r < n; ++r) {
      float* yr = y + r * out;
#pragma omp simd
      for (int64_t o = 0; o < out; ++o) yr[o] += b[o];
    }
  }
}

void linear_bwd(const float* x, const float* w, const float* dy, int64_t n, int64_t in, int64_t out, float* dx,
                float* dw, float* db, bool accumulate_dx) {
  if (dx) sgemm(false, false, n, in, out, 1.0f, dy, out, w, in, accumulate_dx ? 1.0f : 0.0f, dx, in);
  if (dw) sgemm(true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
  if (db) {
    // Row order (not a tree) so that consecutive calls over split rows give the same bits.
    for (int64_t r = 0; r < n; ++r) {
      const float* dyr = dy + r * out;
#pragma omp simd
      for (int64_t o = 0; o < out; ++o) db[o] += dyr[o];
    }
  }
}

}  // namespace lt::cpu
