// bf16 GEMMs through cuBLASLt with fp32 accumulation, in row-major terms:
//   C[m, n] = alpha * op(A) op(B) + beta * C (+ bias[n] when given)
// A is stored [m, k] (or [k, m] when trans_a), B [k, n] (or [n, k] when trans_b); A and B bf16,
// C bf16 or fp32, bias bf16 [n] (bf16 C only; fused as a cuBLASLt epilogue). One workspace, reused;
// the chosen algorithm is cached per shape/alignment. C++17-clean.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace lt::cuda {

struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;  // row stride of A as stored (0: dense)
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  bool c_f32 = false;
  float alpha = 1.f, beta = 0.f;
  const void* bias = nullptr;
  // When set, C_in (same type and layout as C) is read as the beta term and the result goes to c:
  // c = alpha op(A) op(B) + beta * c_in (a residual add fused into the GEMM).
  const void* c_in = nullptr;
};

class Gemm {
 public:
  // workspace: device memory the caller owns (32 MiB recommended), used for every call.
  Gemm(void* workspace, size_t workspace_bytes);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  void run(const GemmArgs& g, cudaStream_t st);
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int>;
  Plan* plan_for(const GemmArgs& g, const Key& key);
  cublasLtHandle_t h_ = nullptr;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  std::map<Key, Plan*> plans_;
};

}  // namespace lt::cuda
