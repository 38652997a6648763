// Decode-time kernels of the CUDA decoder (cuda_decoder.h): attention of one new token per sequence
// against that sequence's KV cache, appending k/v rows to the cache, and argmax over logits rows.
// C++17-clean (included from decode.cu and the C++20 sources). bf16 tensors are passed as void*.
// Every launcher enqueues on `st` and checks the launch; none synchronizes.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "infer/decode_split.h"

namespace lt::cuda {

// The attention is split into pieces of kDecodeSplitKeys keys (flash-decoding; decode_split.h).
using lt::decode_attention_partial_floats;
using lt::decode_attention_splits;
using lt::kDecodeSplitKeys;

// n query rows, one per sequence. q/out bf16 [n, heads*hd] (q after QK-norm and RoPE);
// k_cache/v_cache bf16 rows of kv_heads*hd; row r attends to cache rows row0[r] .. row0[r]+len[r]-1
// (its whole sequence, the new token included: the query sits at position len[r]-1).
// max_len >= every len[r] (sizes the grid). GQA: query head h reads kv head h / (heads/kv_heads).
// Softmax in fp32. partial: fp32 workspace of decode_attention_partial_floats(n, heads, hd, max_len).
struct DecodeAttnDims {
  int64_t n = 0, heads = 0, kv_heads = 0, head_dim = 0, max_len = 0;
  float scale = 1.0f;
};
// Once per shape before CUDA-graph capture: opts the kernel into > 48 KiB of shared memory if needed.
void decode_attention_setup(const DecodeAttnDims& d);
void decode_attention(const DecodeAttnDims& d, const void* q, const void* k_cache, const void* v_cache,
                      const int64_t* row0, const int32_t* len, void* out, float* partial, cudaStream_t st);

// Cache append: row r of k and v (bf16 [n, kv_dim]) goes to cache row dst_row[r] of k_cache / v_cache
// (bf16 rows of kv_dim). kv_dim must be a multiple of 8.
void kv_cache_append(const void* k, const void* v, int64_t n, int64_t kv_dim, const int64_t* dst_row, void* k_cache,
                     void* v_cache, cudaStream_t st);

// ids[r] = argmax of logits row r (fp32 [n, vocab]); ties go to the lowest index (std::max_element),
// NaN never wins.
void argmax_rows(const float* logits, int64_t n, int64_t vocab, int32_t* ids, cudaStream_t st);

}  // namespace lt::cuda
