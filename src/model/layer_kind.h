// LayerKind: what a decoder layer's token mixer is. Every decoder layer is
//   x1 = x + mixer(RMSNorm(x));  y = x1 + MLP(RMSNorm(x1))
// and the kind names the mixer: causal softmax attention (Qwen2/3, Llama-3, Qwen3.5's full layers) or
// the Gated DeltaNet linear-attention mixer (Qwen3.5/3.6's linear layers). Everything that differs by
// kind — parameters, FLOPs, saved internals, workspace, the CPU reference and the kernels — lives in
// one place per kind (model/kinds/, backend/cpu/mixers/); callers ask the kind, never branch on arch.
#pragma once
#include <cstdint>
#include <string>

namespace lt {

enum class LayerKind : uint8_t { Attention = 0, GatedDeltaNet = 1 };
constexpr int kNumLayerKinds = 2;

// HF layer_types spelling: "full_attention", "linear_attention".
const char* layer_kind_hf_name(LayerKind k);
// Short display name: "attention", "deltanet".
const char* layer_kind_short_name(LayerKind k);
// Parses the HF spelling; false when unknown.
bool parse_layer_kind(const std::string& s, LayerKind* out);

}  // namespace lt
