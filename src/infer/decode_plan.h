// Memory plan of the GPU decoder (src/infer/cuda/cuda_decoder.h), kept free of CUDA so that the
// CPU build and its tests see it: what lives on the device for greedy decoding with a KV cache, and
// whether the bf16 weights stay resident or stream through two device slots.
//
//   resident: embedding + head + every layer + KV cache + workspace
//   streamed: embedding + head + 2 layer slots (double buffer) + KV cache + workspace; the layers sit
//             in pinned host memory and are uploaded once per forward pass (prefill or decode step)
#pragma once
#include <cstdint>
#include <string>

#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt {

enum class WeightsMode { Auto, Resident, Streamed };
WeightsMode parse_weights_mode(const std::string& s);  // auto | resident | streamed; throws lt::Error
const char* weights_mode_name(WeightsMode m);

// KV-cache and workspace capacity. The cache holds max_batch * max_seq rows per layer: a batch whose
// sequences need `cap` rows each (prompt + new tokens) decodes up to (max_batch * max_seq) / cap of
// them at once. Prefill packs whole prompts into passes of at most prefill_rows rows.
struct DecodeCapacity {
  int64_t max_batch = 0, max_seq = 0, prefill_rows = 0;
};
// prefill_rows = max(max_seq, min(max_batch * max_seq, kDecodePrefillRows)).
constexpr int64_t kDecodePrefillRows = 8192;
DecodeCapacity decode_capacity(int64_t max_batch, int64_t max_seq);

// Byte offsets of the decoder's workspace pieces (256-byte aligned) from one base pointer.
// R = max(prefill_rows, max_batch) activation rows; B = max_batch logits rows.
struct DecodeWorkspace {
  int64_t x = 0, x1 = 0, h = 0, gu = 0, act = 0;             // bf16 activations [R, *] (shared by every kind)
  int64_t mixer = 0, mixer_bytes = 0;                        // the mixers' scratch (decode_state.h), R rows
  int64_t hn = 0, xr = 0;                                    // bf16 [B, hidden] (head)
  int64_t logits = 0;                                        // fp32 [B, vocab]
  int64_t partial = 0;                                       // fp32 decode-attention splits
  int64_t ids = 0, pos = 0, seg = 0, len = 0, slot = 0, out_ids = 0;  // int32 tables
  int64_t dst_row = 0, row0 = 0, last_rows = 0;              // int64 tables
  int64_t inv_freq = 0, err = 0;
  int64_t gemm = 0;  // cuBLASLt workspace
  int64_t bytes = 0;
  // Host staging of the per-pass tables (pinned): ids, pos, seg, len, slot, dst_row, row0, last_rows.
  int64_t table_bytes = 0;
};
constexpr int64_t kDecodeGemmWorkspace = int64_t(32) << 20;
DecodeWorkspace decode_workspace(const ModelConfig& c, const DecodeCapacity& cap);

struct DecodeMemory {
  int64_t embedding = 0, head = 0;      // bf16, always on the device (head: final norm + untied lm_head)
  int64_t layers = 0, layer_max = 0;    // bf16, all layers / the largest one (one streaming slot)
  int64_t kv_cache = 0;                 // per-layer decoding state (decode_state.h): attention layers' K and V
                                        // (bf16 [max_batch * max_seq, kv_dim] each), Gated DeltaNet layers'
                                        // conv windows and recurrent states (fp32, one slot per sequence)
  int64_t workspace = 0;                // DecodeWorkspace::bytes
  int64_t resident() const { return embedding + head + layers + kv_cache + workspace; }
  int64_t streamed() const { return embedding + head + 2 * layer_max + kv_cache + workspace; }
};
int64_t decode_unit_bytes(const UnitLayout& u);  // bf16 bytes of a unit, rounded up to 256
DecodeMemory decode_memory(const ModelConfig& c, const ModelLayout& lay, const DecodeCapacity& cap);

struct WeightsChoice {
  WeightsMode mode = WeightsMode::Resident;  // never Auto
  int64_t device_bytes = 0;                  // what the decoder allocates on the device
};
// Throws "does not fit: device short by <need - room> <what> (needs <need>, <room_desc>); <advice>":
// the decoder's one form of that error (its sizing here and its growth later). Call it when need > room.
[[noreturn]] void fail_decode_does_not_fit(int64_t need, int64_t room, const std::string& what,
                                           const std::string& room_desc, const std::string& advice);
// Auto: resident when it fits `budget` bytes, else streamed. A forced mode must fit too. Throws
// "does not fit: ..." naming the budget, what is needed and what to lower.
WeightsChoice choose_weights_mode(const DecodeMemory& m, int64_t budget, WeightsMode asked);

}  // namespace lt
