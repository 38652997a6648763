// Batched greedy decoding with a KV cache on one GPU (the CUDA side of `lazytrain generate/eval`).
//
//  * Weights: bf16 copies of every unit (converted once). Resident when embedding + head + all layers +
//    KV cache + workspace fit the budget (decode_plan.h); otherwise streamed: the layers live in pinned
//    host memory and pass through two device slots, the upload of layer l+1 (copy stream) overlapping
//    the compute of layer l (events), for every forward pass. WeightsMode forces either.
//  * A batch: all prompts are prefilled together (packed rows, one segment per prompt, causal attention
//    within each prompt), then all live sequences advance one token per step (decode attention over
//    each sequence's own cache). Argmax runs on the GPU; only the ids come back.
//  * Every layer kind (model/layer_kind.h) has its decode mixer (decode_mixer.h) and its decoding state
//    per layer (decode_state.h): attention layers a KV cache (gated attention, (1 + w) QK-norm and
//    partial RoPE for Qwen3.5/3.6), Gated DeltaNet layers conv windows and fp32 recurrent states, one
//    slot per sequence of the batch, written by the prefill and advanced by every decode step.
//  * Same semantics as lt::train::greedy_generate: batches of batch_size prompts in order, generation of
//    a sequence ends after a stop id or max_new_tokens, the stop id is part of the output.
// No CUDA types in this header (it is included from C++20 sources of the CLI, tests and benches).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "infer/decode_plan.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt::cuda {

// Device memory handed in by an owner (e.g. the CUDA training backend's arena, so that evaluation
// after training uses the memory training released). Null alloc: the decoder uses cudaMalloc.
struct DeviceMemorySource {
  std::function<void*(int64_t bytes, const char* tag)> alloc;
  std::function<void(void*)> release;
  int64_t available = 0;  // bytes alloc can still give
};

struct DecoderOptions {
  int device = 0;
  int64_t gpu_mem_cap = 0;  // bytes the process may use on the GPU; 0: its free memory
  int64_t margin = int64_t(768) << 20;  // kept outside the budget (context, cuBLAS handle, modules)
  WeightsMode weights = WeightsMode::Auto;
  int64_t max_batch = 32, max_seq = 256;  // KV-cache capacity (grows on demand when it fits)
  DeviceMemorySource memory;             // optional borrowed device memory (then gpu_mem_cap is ignored)
  bool capture_logits = false;           // tests: keep every pass's logits (fp32) on the host
  bool cuda_graphs = true;               // replay resident decode steps as CUDA graphs
};

// Fills dst (layout.units[unit].numel bf16 values, UnitLayout order) with that unit's weights.
using UnitSource = std::function<void(int64_t unit, uint16_t* dst)>;
// A UnitSource rounding fp32 units (UnitLayout order) to bf16 (round to nearest even).
UnitSource fp32_units(const ModelLayout& layout, std::vector<const float*> units);

struct DecodeCounters {
  int64_t sequences = 0, prompt_tokens = 0, generated_tokens = 0;
  int64_t passes = 0;             // forward passes (prefill passes + decode steps)
  int64_t graphs = 0;             // decode-step CUDA graphs captured
  int64_t bytes_uploaded = 0;     // streamed layer bytes
  double prefill_seconds = 0, decode_seconds = 0;
};

// Why this model cannot be decoded on the GPU ("" when it can): a Gated DeltaNet shape the kernels do not
// support (the callers fall back to the CPU for --device auto; CudaDecoder throws this reason).
std::string decoder_unsupported(const ModelConfig& c);

class CudaDecoder {
 public:
  CudaDecoder(const ModelConfig& c, const ModelLayout& layout, const UnitSource& src, const DecoderOptions& o);
  ~CudaDecoder();
  CudaDecoder(const CudaDecoder&) = delete;
  CudaDecoder& operator=(const CudaDecoder&) = delete;

  // Generated ids of each prompt (stop id included when emitted).
  std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens,
                                             int64_t batch_size, const std::vector<int32_t>& stop_ids);

  WeightsMode mode() const;
  bool uses_graphs() const;
  std::string device_name() const;             // "cuda:0 (NVIDIA H200)"
  std::string describe() const;                // device, weights mode, device bytes
  int64_t device_bytes() const;                // what the decoder holds on the device
  const DecodeCounters& counters() const;
  void reset_counters();
  // Logits of every pass since the last clear (capture_logits): per pass [rows, vocab], the rows being the
  // sequences whose next token it chose, in batch order.
  const std::vector<std::vector<float>>& captured_logits() const;
  void clear_captured_logits();
  // Benchmarks: bytes of the layers one pass streams, and the seconds `passes` uploads of all layers
  // take on the copy stream alone (no compute).
  int64_t streamed_bytes_per_pass() const;
  double time_uploads_only(int passes);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace lt::cuda
