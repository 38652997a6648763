#include "backend/cuda/cuda_util.h"

#include <cublas_api.h>

#include "core/error.h"

namespace lt::cuda {

void fail_cuda(cudaError_t e, const char* what, const char* file, int line) {
  fail("CUDA: {} failed at {}:{}: {}: {}", what, file, line, cudaGetErrorName(e), cudaGetErrorString(e));
}

void fail_cublas(int status, const char* what, const char* file, int line) {
  fail("cuBLAS: {} failed at {}:{}: status {} ({})", what, file, line, status,
       cublasGetStatusString(static_cast<cublasStatus_t>(status)));
}

void fail_msg(const char* msg, const char* file, int line) { fail("CUDA backend: {} (at {}:{})", msg, file, line); }

void select_device(int device, const char* who) {
  int n_dev = 0;
  const cudaError_t e = cudaGetDeviceCount(&n_dev);
  if (e != cudaSuccess || n_dev == 0)
    fail("{}: no usable GPU ({})", who, e == cudaSuccess ? "no devices" : cudaGetErrorString(e));
  LT_CHECK(device >= 0 && device < n_dev, "{}: device {} requested, {} present", who, device, n_dev);
  LT_CUDA(cudaSetDevice(device));
}

}  // namespace lt::cuda
