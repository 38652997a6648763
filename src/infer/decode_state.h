// Per-kind memory of the GPU decoder (src/infer/cuda/decode_mixer.h), kept free of CUDA so that the
// memory plan (decode_plan.h) and the CPU tests see it. Each layer kind (model/layer_kind.h) has
//   * a decoding STATE per layer, kept across the passes of a batch: the attention layers' K and V
//     caches, the Gated DeltaNet layers' conv windows and fp32 recurrent states (one slot per sequence);
//   * a SCRATCH layout for one pass over R rows (projections and internals), carved from the decoder's
//     mixer region, whose size is the largest over the kinds present.
// The CUDA decode mixers carve exactly these offsets (byte offsets, 256-byte aligned).
#pragma once
#include <cstdint>

#include "model/layer_kind.h"
#include "model/model_config.h"

namespace lt {

struct DecodeCapacity;

// Attention layer. State: K then V, bf16 [max_batch * max_seq, kv_dim] each (cache rows).
struct AttnDecodeState {
  int64_t k = 0, v = 0, bytes = 0;
};
// Scratch: q, o bf16 [R, q_dim]; k, v bf16 [R, kv_dim]; lse fp32 [R, heads] (prefill attention);
// with attn_output_gate also qfull bf16 [R, 2 q_dim] (q_proj's output) and gate bf16 [R, q_dim].
struct AttnDecodeScratch {
  int64_t q = 0, k = 0, v = 0, o = 0, lse = 0, qfull = -1, gate = -1, bytes = 0;
};
AttnDecodeState attn_decode_state(const ModelConfig& c, const DecodeCapacity& cap);
AttnDecodeScratch attn_decode_scratch(const ModelConfig& c, int64_t rows);

// Gated DeltaNet layer. State per batch slot: conv window fp32 [max_batch, conv_dim, K-1] (the last K-1
// pre-conv inputs of each channel, oldest first), recurrent state fp32 [max_batch, Hv, Dk, Dv].
struct GdnDecodeState {
  int64_t conv = 0, rec = 0, bytes = 0;
};
// Scratch over R rows: qkv [R, conv_dim], z [R, value_dim], b, a [R, Hv], y [R, conv_dim] (conv output),
// qn, kn [R, key_dim], v, o, gout [R, value_dim] bf16; g, beta, rstd fp32 [R, Hv]; chunk_states fp32
// [ceil(R / 64), Hv, Dk, Dv] (the chunked rule's chunk-start states of a prefill pass, batch 1 x R rows).
struct GdnDecodeScratch {
  int64_t qkv = 0, z = 0, b = 0, a = 0, y = 0, qn = 0, kn = 0, v = 0, o = 0, gout = 0;
  int64_t g = 0, beta = 0, rstd = 0, chunk_states = 0, bytes = 0;
};
GdnDecodeState gdn_decode_state(const ModelConfig& c, const DecodeCapacity& cap);
GdnDecodeScratch gdn_decode_scratch(const ModelConfig& c, int64_t rows);

// Bytes of one layer's state / one pass's scratch for a layer of kind k.
int64_t decode_state_bytes(const ModelConfig& c, LayerKind k, const DecodeCapacity& cap);
int64_t decode_scratch_bytes(const ModelConfig& c, LayerKind k, int64_t rows);

}  // namespace lt
