// Where `lazytrain generate/eval` (and the trainer's final evaluation) decode: the CPU, or the GPU
// through the CUDA decoder (src/infer/cuda/cuda_decoder.h). The train module never sees CUDA: the
// CLI hands in GpuDecodeHooks when the build has the CUDA backend (as it does for the training
// backend, trainer.h), and this file only decides.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "infer/decode_plan.h"
#include "infer/generate.h"

namespace lt::train {

enum class DecodeDevice { Auto, Cpu, Cuda };
DecodeDevice parse_decode_device(const std::string& s);  // auto | cpu | cuda; throws lt::Error
const char* decode_device_name(DecodeDevice d);

struct DecodeDeviceOptions {
  DecodeDevice device = DecodeDevice::Auto;  // auto: CUDA when the build has it and a GPU is visible
  double gpu_mem_gib = 0;                    // GPU memory cap in GiB; 0: the free device memory
  WeightsMode weights = WeightsMode::Auto;   // resident when they fit, else streamed
  int64_t max_batch = 32, max_seq = 256;     // KV-cache capacity to plan for (prompt + new tokens)

  // Capacity for n_prompts prompts decoded `batch` at a time: min(batch, n_prompts) sequences of
  // longest_prompt + max_new_tokens tokens (at least 1 each).
  void size_for(int64_t batch, int64_t n_prompts, int64_t longest_prompt, int64_t max_new_tokens) {
    max_batch = std::max<int64_t>(1, std::min(batch, n_prompts));
    max_seq = std::max<int64_t>(1, longest_prompt + std::max<int64_t>(0, max_new_tokens));
  }
};

// The CUDA side, set by the CLI when lazytrain is built with the CUDA backend (null members: not built).
struct GpuDecodeHooks {
  std::function<bool()> gpu_visible;
  // borrow: a CUDA training backend whose device memory the decoder allocates from (null: its own).
  std::function<std::unique_ptr<Generator>(const ModelWeightsView&, const DecodeDeviceOptions&, Backend* borrow)> make;
  // Why the GPU decoder cannot decode this model ("" when it can; null: it can decode any).
  std::function<std::string(const ModelConfig&)> unsupported;
  bool built() const { return bool(gpu_visible) && bool(make); }
  std::string unsupported_reason(const ModelConfig& c) const { return unsupported ? unsupported(c) : std::string(); }
};

// What `device` resolves to: Cpu or Cuda. Throws for `cuda` without the CUDA build or without a GPU.
DecodeDevice resolve_decode_device(DecodeDevice device, const GpuDecodeHooks& gpu);

// The generator for these options. Options that only apply to the GPU (weights, gpu_mem) are ignored
// on the CPU with a warning when they were set. A model the GPU decoder does not support (hybrid
// Qwen3.5/3.6 for now) decodes on the CPU under `auto` (with a note) and is an error under `cuda`.
std::unique_ptr<Generator> make_generator(const ModelWeightsView& w, const DecodeDeviceOptions& o,
                                          const GpuDecodeHooks& gpu, Backend* borrow = nullptr);

}  // namespace lt::train
