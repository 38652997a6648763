// Error checking for CUDA runtime, cuBLAS(Lt) calls. C++17-clean (included from .cu files).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace lt::cuda {

// Throws lt::Error "<what> failed at <file>:<line>: <cuda error name>: <description>".
[[noreturn]] void fail_cuda(cudaError_t e, const char* what, const char* file, int line);
[[noreturn]] void fail_cublas(int status, const char* what, const char* file, int line);
// Throws lt::Error with a plain message (for .cu files, which cannot use fmt-based LT_CHECK).
[[noreturn]] void fail_msg(const char* msg, const char* file, int line);
// Makes `device` current for the calling thread after checking that it exists; errors name `who`
// ("CUDA backend", "CUDA decoder") and say why no GPU is usable.
void select_device(int device, const char* who);

}  // namespace lt::cuda

#define LT_CUDA(call)                                                            \
  do {                                                                           \
    cudaError_t lt_e_ = (call);                                                  \
    if (lt_e_ != cudaSuccess) ::lt::cuda::fail_cuda(lt_e_, #call, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: catches launch-configuration errors at once.
#define LT_CUDA_LAUNCH() LT_CUDA(cudaGetLastError())
#define LT_CUBLAS(call)                                                                \
  do {                                                                                 \
    int lt_s_ = static_cast<int>(call);                                                \
    if (lt_s_ != 0) ::lt::cuda::fail_cublas(lt_s_, #call, __FILE__, __LINE__);        \
  } while (0)
#define LT_CUDA_REQUIRE(cond, msg)                                   \
  do {                                                               \
    if (!(cond)) ::lt::cuda::fail_msg(msg, __FILE__, __LINE__);      \
  } while (0)
