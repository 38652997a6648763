// The token mixer of a decoder layer in GPU decoding (cuda_decoder.h), one implementation per layer kind
// (model/layer_kind.h), as mixer.h is for training: decode_mixer_attention.cpp (causal GQA attention over
// a KV cache, with Qwen3.5's output gate, (1 + w) QK-norm and partial RoPE) and decode_mixer_deltanet.cpp
// (Gated DeltaNet: conv windows and fp32 recurrent states per sequence). The decoder owns what every kind
// shares (embedding, the two RMSNorms, the residuals, the SwiGLU MLP, the head) and calls the mixer of
// c.kind(layer) through this interface.
//
// Memory: each layer has a decoding state (decode_state.h: its kind's layout for the decoder's capacity),
// kept across the passes of a batch; each pass carves the kind's scratch layout from one shared region.
// Everything is enqueued on the call's stream without synchronizing (decode steps are captured as CUDA
// graphs: a mixer reads every per-pass quantity from the device tables, never from the host).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "backend/cuda/gemm/gemm.h"
#include "infer/decode_plan.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt::cuda {

// One forward pass of the decoder: a prefill pass (whole prompts packed back to back, rows of prompt p
// are first(p) .. last_rows[p]) or a decode step (one row per live sequence). Device tables.
struct DecodePass {
  int64_t rows = 0;               // T
  int64_t seqs = 0;               // sequences in the pass (prefill: prompts; decode: == rows)
  bool prefill = false;
  int64_t max_len = 0;            // decode: >= every len[r] (sizes the attention grid)
  const int32_t* pos = nullptr;   // [rows] position of each row in its sequence
  const int32_t* seg = nullptr;   // prefill: [rows] prompt index of each row within the pass
  const int32_t* len = nullptr;   // decode: [rows] sequence length with the new token
  const int32_t* slot = nullptr;  // [seqs] batch slot of each sequence (index of its recurrent state)
  const int64_t* dst_row = nullptr;    // [rows] KV-cache row of each row's k and v
  const int64_t* row0 = nullptr;       // decode: [rows] first KV-cache row of the row's sequence
  const int64_t* last_rows = nullptr;  // prefill: [seqs] last row of each prompt
  const float* inv_freq = nullptr;     // RoPE inverse frequencies [rotary_dim / 2]
  float* attn_partial = nullptr;       // decode: the decode attention's split workspace (decode.h)
};

struct DecodeMixerCall {
  const UnitLayout& lay;
  const uint16_t* w;      // the layer's flat bf16 weights
  const DecodePass& pass;
  const DecodeCapacity& cap;
  void* state;            // this layer's decoding state (decode_state_bytes of its kind for cap)
  void* scratch;          // the mixers' scratch region (>= decode_scratch_bytes of the kind for the pass rows)
  Gemm& gemm;
  cudaStream_t st;
};

class DecodeMixer {
 public:
  virtual ~DecodeMixer() = default;
  // x1 [rows, hidden] = res + mixer(h) (h: the layer's normalised input, bf16); reads and advances the
  // layer's decoding state (a prefill pass writes the state of each prompt's slot from scratch).
  virtual void forward(const DecodeMixerCall& m, const void* h, const void* res, void* x1) = 0;
};

// Throw lt::Error naming what is unsupported.
std::unique_ptr<DecodeMixer> make_attention_decode_mixer(const ModelConfig& c);
std::unique_ptr<DecodeMixer> make_deltanet_decode_mixer(const ModelConfig& c);
std::unique_ptr<DecodeMixer> make_decode_mixer(const ModelConfig& c, LayerKind k);

// base + a byte offset of a decode_state.h layout, typed.
template <typename T>
T* at_offset(void* base, int64_t off) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + off);
}

// Y[T, N] = X W^T (+ bias) (+ res when given), bf16, W in HF [out, in] layout; ldc: row stride of Y (0: N).
void decode_linear(Gemm& gemm, cudaStream_t st, int64_t T, const void* X, const uint16_t* W, const uint16_t* bias,
                   void* Y, int64_t N, int64_t K, int64_t ldc = 0, const void* res = nullptr);

}  // namespace lt::cuda
