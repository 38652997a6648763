// Gated DeltaNet mixer on the GPU (placeholder until the kernels of deltanet.h are integrated).
#include "backend/cuda/mixer.h"
#include "core/error.h"

namespace lt::cuda {

std::unique_ptr<Mixer> make_deltanet_mixer(const ModelConfig& c, Gemm&) {
  fail("CUDA backend: the Gated DeltaNet (linear_attention) layers of {} are not supported on the GPU yet; use "
       "--backend cpu",
       c.name);
}

}  // namespace lt::cuda
