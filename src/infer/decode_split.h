// The flash-decoding split of the decode attention, shared by the CUDA kernels (decode.cu, compiled as
// C++17) and the CPU-side sizing of the decoder's workspace (decode_plan.cpp): one definition, so the
// workspace the planner sizes is the one the kernel fills.
#pragma once
#include <cstdint>

namespace lt {

// Keys per split: a sequence of len keys is cut into ceil(len / kDecodeSplitKeys) independent pieces
// whose partial softmax states a second kernel combines. Fixed, so that a row's result never depends
// on the other rows of the batch.
constexpr int64_t kDecodeSplitKeys = 128;

// Splits of a sequence of at most max_len keys.
constexpr int64_t decode_attention_splits(int64_t max_len) { return (max_len + kDecodeSplitKeys - 1) / kDecodeSplitKeys; }

// fp32 floats of the partial states for n rows of `heads` heads attending to at most max_len keys:
// per split, head_dim accumulators plus the running max and sum.
constexpr int64_t decode_attention_partial_floats(int64_t n, int64_t heads, int64_t head_dim, int64_t max_len) {
  return n * heads * decode_attention_splits(max_len) * (head_dim + 2);
}

}  // namespace lt
