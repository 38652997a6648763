// Parameter layout: the model is a sequence of *units*, each with one flat fp32
// buffer of parameters (the CPU master), a bf16 streaming copy and a gradient of
// the same layout:
//   unit 0          embedding      model.embed_tokens.weight [vocab, hidden]
//   unit 1..L       decoder layers model.layers.{i}.<suffix>
//   unit L+1        head           model.norm.weight [hidden] (+ lm_head.weight [vocab, hidden] if untied)
// ("model." is "model.language_model." for composite Qwen3.5 checkpoints: ModelConfig::text_prefix()).
// Embedding and head params keep their suffix without that prefix ("embed_tokens.weight", "norm.weight").
// With tied embeddings the LM head reads unit 0's matrix and its gradient adds to unit 0's.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace lt {

struct ParamInfo {
  std::string name;            // full HF name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::string suffix;          // name within the unit, e.g. "self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // HF shape (out, in) for linear weights
  int64_t offset = 0;          // element offset in the unit's flat buffer (multiple of kParamAlign)
  int64_t numel = 0;
  bool decay = true;           // weight decay applies (false for norms and biases)
  bool is_matrix = false;      // 2-D weight (eligible for 8-bit optimizer state; embeddings excluded by policy)
  bool is_embedding = false;
};

enum class UnitKind { Embedding, Layer, Head };

struct UnitLayout {
  UnitKind kind = UnitKind::Layer;
  int64_t layer = -1;  // decoder layer index for Layer units
  std::vector<ParamInfo> params;
  int64_t numel = 0;   // flat buffer size in elements (with alignment padding)
  const ParamInfo& find(const std::string& suffix) const;  // throws lt::Error if absent
  const ParamInfo* try_find(const std::string& suffix) const;
};

constexpr int64_t kParamAlign = 64;  // elements; keeps every tensor 256-byte aligned in fp32

// Suffixes within a decoder layer, in layout order: input_layernorm.weight, the layer kind's mixer
// parameters (model/mixer_attention.cpp: self_attn.*; model/mixer_deltanet.cpp: linear_attn.*),
// post_attention_layernorm.weight, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight.
UnitLayout layer_unit_layout(const ModelConfig& c, int64_t layer);
UnitLayout embedding_unit_layout(const ModelConfig& c);
UnitLayout head_unit_layout(const ModelConfig& c);

struct ModelLayout {
  std::vector<UnitLayout> units;  // size L+2
  const UnitLayout& embedding() const { return units.front(); }
  const UnitLayout& head() const { return units.back(); }
  const UnitLayout& layer(int64_t i) const { return units[size_t(i + 1)]; }
  int64_t parameter_count() const;  // real parameters (no padding), tied counted once
  // Largest decoder-layer buffer (elements): layers of different kinds differ (hybrid models), and the
  // device's weight ring and gradient slots must hold any of them.
  int64_t max_layer_numel() const;
};
ModelLayout model_layout(const ModelConfig& c);

}  // namespace lt
