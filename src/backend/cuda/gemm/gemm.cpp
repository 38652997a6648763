#include "backend/cuda/gemm/gemm.h"

#include <algorithm>

#include "backend/cuda/cuda_util.h"
#include "core/error.h"

namespace lt::cuda {

struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;
};

namespace {
int alignment_of(const void* p, int64_t ld_elems, int64_t elem) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p) | uintptr_t(ld_elems * elem);
  int a = 256;
  while (a > 1 && (v % a) != 0) a /= 2;
  return a;
}
}  // namespace

Gemm::Gemm(void* workspace, size_t workspace_bytes) : ws_(workspace), ws_bytes_(workspace_bytes) {
  LT_CUBLAS(cublasLtCreate(&h_));
}

Gemm::~Gemm() {
  for (auto& [k, p] : plans_) {
    cublasLtMatmulDescDestroy(p->op);
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    delete p;
  }
  if (h_) cublasLtDestroy(h_);
}

// Row-major C[m,n] = op(A) op(B) is column-major C^T[n,m] = op(B)^T op(A)^T: cuBLASLt's "A" is our B
// (n x k after its op) and its "B" is our A.
Gemm::Plan* Gemm::plan_for(const GemmArgs& g, const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  auto* p = new Plan;
  const cudaDataType_t ct = g.c_f32 ? CUDA_R_32F : CUDA_R_16BF;
  LT_CUBLAS(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS A = our B
  const cublasOperation_t opb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS B = our A
  LT_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  LT_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (g.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    LT_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    const cudaDataType_t bt = CUDA_R_16BF;
    LT_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  const int64_t lda = std::get<3>(key), ldb = std::get<4>(key), ldc = std::get<5>(key);
  // cuBLAS A: stored (col-major) rows x cols with leading dimension = our B's row stride.
  if (g.trans_b)
    LT_CUBLAS(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, uint64_t(g.k), uint64_t(g.n), ldb));
  else
    LT_CUBLAS(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, uint64_t(g.n), uint64_t(g.k), ldb));
  if (g.trans_a)
    LT_CUBLAS(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, uint64_t(g.m), uint64_t(g.k), lda));
  else
    LT_CUBLAS(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, uint64_t(g.k), uint64_t(g.m), lda));
  LT_CUBLAS(cublasLtMatrixLayoutCreate(&p->lc, ct, uint64_t(g.n), uint64_t(g.m), ldc));

  cublasLtMatmulPreference_t pref;
  LT_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  LT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes_,
                                                 sizeof(ws_bytes_)));
  const auto al = static_cast<uint32_t>(std::get<8>(key));
  const uint32_t aa = al & 0x1ff, ab = (al >> 9) & 0x1ff, ac = (al >> 18) & 0x1ff;
  LT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ab, sizeof(ab)));
  LT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &aa, sizeof(aa)));
  LT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof(ac)));
  LT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof(ac)));
  cublasLtMatmulHeuristicResult_t res{};
  int n_res = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(h_, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &n_res);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || n_res == 0)
    fail("cuBLASLt: no algorithm for GEMM m={} n={} k={} trans_a={} trans_b={} c_f32={} bias={} (status {})", g.m,
         g.n, g.k, g.trans_a, g.trans_b, g.c_f32, g.bias != nullptr, int(s));
  p->algo = res.algo;
  p->has_algo = true;
  plans_[key] = p;
  return p;
}

void Gemm::run(const GemmArgs& g, cudaStream_t st) {
  if (g.m == 0 || g.n == 0) return;
  LT_CHECK(g.k > 0, "GEMM with k = 0 (m={} n={})", g.m, g.n);
  LT_CHECK(!(g.bias && g.c_f32), "GEMM: bias epilogue only with bf16 output");
  const int64_t lda = g.lda ? g.lda : (g.trans_a ? g.m : g.k);
  const int64_t ldb = g.ldb ? g.ldb : (g.trans_b ? g.k : g.n);
  const int64_t ldc = g.ldc ? g.ldc : g.n;
  const int64_t ce = g.c_f32 ? 4 : 2;
  const int aa = alignment_of(g.a, lda, 2), ab = alignment_of(g.b, ldb, 2);
  const int ac = std::min(alignment_of(g.c, ldc, ce), g.c_in ? alignment_of(g.c_in, ldc, ce) : 256);
  const int flags = (g.trans_a ? 1 : 0) | (g.trans_b ? 2 : 0) | (g.c_f32 ? 4 : 0) | (g.bias ? 8 : 0) |
                    (g.beta != 0.f ? 16 : 0);
  const Key key{g.m, g.n, g.k, lda, ldb, ldc, flags, 0, aa | (ab << 9) | (ac << 18)};
  Plan* p = plan_for(g, key);
  if (g.bias)
    LT_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
  const void* cin = g.c_in ? g.c_in : g.c;
  LT_CUBLAS(cublasLtMatmul(h_, p->op, &g.alpha, g.b, p->la, g.a, p->lb, &g.beta, cin, p->lc, g.c, p->lc, &p->algo,
                           ws_, ws_bytes_, st));
}

}  // namespace lt::cuda
