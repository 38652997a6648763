// The CUDA decoder behind train::make_generator, for the commands that decode (`generate`, `eval`, and
// `train`'s final evaluation). The hooks come from lt_infer_cuda (infer/cuda/cuda_generator.cpp) in a build
// with the CUDA backend, which defines LT_HAVE_CUDA for the targets linking it; otherwise they are empty and
// decoding runs on the CPU.
#pragma once
#include "infer/decode_device.h"

namespace lt::infer {

#ifdef LT_HAVE_CUDA
train::GpuDecodeHooks cuda_decode_hooks();
bool cuda_device_count_positive();
#endif

inline train::GpuDecodeHooks gpu_decode_hooks() {
#ifdef LT_HAVE_CUDA
  return cuda_decode_hooks();
#else
  return {};
#endif
}

// This build has the CUDA backend and a CUDA device is visible.
inline bool cuda_device_visible() {
#ifdef LT_HAVE_CUDA
  return cuda_device_count_positive();
#else
  return false;
#endif
}

}  // namespace lt::infer
