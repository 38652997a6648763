// Batched greedy decoding with a KV cache on the CPU, composed from the op-level reference kernels
// (backend/cpu/ops.h). Prompts are prefilled one by one (causal attention over the prompt), then all
// live sequences advance together one token per step: the projections and the LM head run as one
// GEMM over the batch's rows; attention reads each sequence's own cache.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/param_layout.h"
#include "model/weights.h"

namespace lt::data {
class Tokenizer;
}

namespace lt::train {

// fp32 weights of every unit (0 = embedding, 1..L = layers, L+1 = head), laid out by `layout`.
struct ModelWeightsView {
  const ModelConfig* cfg = nullptr;
  const ModelLayout* layout = nullptr;
  std::vector<const float*> units;
};
// The view of loaded weights (every unit of `w`).
ModelWeightsView view_of(const ModelWeights& w);

struct GenerateOptions {
  int64_t max_new_tokens = 64;       // >= 0; 0: prompts are prefilled and nothing is generated
  int64_t batch_size = 32;           // sequences decoded together
  std::vector<int32_t> stop_ids;     // generation of a sequence ends after emitting one of these
};


// What a decoder did, summed over its generate() calls.
struct DecodeStats {
  int64_t sequences = 0, prompt_tokens = 0, generated_tokens = 0;
  double prefill_seconds = 0;  // prompts through the model, first token chosen
  double decode_seconds = 0;   // the steps after the first token
  double seconds() const { return prefill_seconds + decode_seconds; }
};
// The generation limit a user sets (`--max-new-tokens`, the config key `max_new_tokens`): throws lt::Error
// naming `what` unless n >= 1.
void check_max_new_tokens(int64_t n, const std::string& what);
// Throws lt::Error naming `what` unless a prompt of `prompt_tokens` tokens plus max_new_tokens new ones
// fits the model's max_position (checked without overflow: any int64 max_new_tokens is safe).
void check_fits_max_position(const ModelConfig& c, int64_t prompt_tokens, int64_t max_new_tokens,
                             const std::string& what);

// Drops a trailing stop token (one of stop_ids) from generated ids, before decoding them to text.
void strip_stop(std::vector<int32_t>& ids, const std::vector<int32_t>& stop_ids);

// What `lazytrain generate` prints for prompt `index`: "### prompt I: PROMPT\n", then the generated
// ids (a trailing stop token dropped, special tokens skipped) decoded to their bytes exactly, NUL and
// invalid UTF-8 included (fwrite, not printf %s), then "\n\n".
void write_generation(std::FILE* out, size_t index, const std::string& prompt, const data::Tokenizer& tok,
                      std::vector<int32_t> ids, const std::vector<int32_t>& stop_ids);

// Returns the generated ids of each prompt (stop token included if emitted); adds to *stats if given.
// Throws lt::Error for a negative max_new_tokens or a prompt + max_new_tokens past max_position.
std::vector<std::vector<int32_t>> greedy_generate(const ModelWeightsView& w,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  const GenerateOptions& opt, DecodeStats* stats = nullptr);

// One line: "<where>: N tokens generated in S s (T tokens/s; decode steps D tokens/s), P prompt tokens".
std::string format_decode_stats(const std::string& where, const DecodeStats& s);

// A greedy decoder with greedy_generate's semantics, on some device (decode_device.h chooses).
class Generator {
 public:
  virtual ~Generator() = default;
  virtual std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                                     const GenerateOptions& opt) = 0;
  virtual std::string describe() const = 0;  // "CPU (fp32, KV cache)", "cuda:0 (NVIDIA H200), weights resident, ..."
  virtual DecodeStats stats() const = 0;
};
// greedy_generate on the CPU; borrows w's weights.
std::unique_ptr<Generator> make_cpu_generator(const ModelWeightsView& w);

// Logits [ids.size(), vocab] of one sequence by a full (non-incremental) forward; for tests.
std::vector<float> forward_logits(const ModelWeightsView& w, const std::vector<int32_t>& ids);

}  // namespace lt::train
