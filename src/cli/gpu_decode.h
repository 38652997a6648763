// The CUDA decoder (src/backend/cuda/cuda_decoder.h) behind train::make_generator, for the commands
// that decode (`generate`, `eval`, and `train`'s final evaluation). Empty hooks when this lazytrain
// was built without the CUDA backend.
#pragma once
#include "infer/decode_device.h"

namespace lt::cli {
train::GpuDecodeHooks gpu_decode_hooks();
// This build has the CUDA backend and a CUDA device is visible.
bool cuda_device_visible();
}  // namespace lt::cli
