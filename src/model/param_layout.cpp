#include "model/param_layout.h"

#include <algorithm>

#include "core/error.h"
#include "model/mixer.h"

namespace lt {

namespace {

struct Builder {
  UnitLayout u;
  std::string prefix;
  void add(const std::string& suffix, std::vector<int64_t> shape, bool decay, bool matrix, bool emb = false) {
    ParamInfo p;
    p.suffix = suffix;
    p.name = prefix + suffix;
    p.shape = std::move(shape);
    p.numel = 1;
    for (auto d : p.shape) p.numel *= d;
    p.offset = u.numel;
    p.decay = decay;
    p.is_matrix = matrix;
    p.is_embedding = emb;
    u.numel += (p.numel + kParamAlign - 1) / kParamAlign * kParamAlign;
    u.params.push_back(std::move(p));
  }
};

}  // namespace

const ParamInfo* UnitLayout::try_find(const std::string& suffix) const {
  for (auto& p : params)
    if (p.suffix == suffix) return &p;
  return nullptr;
}

const ParamInfo& UnitLayout::find(const std::string& suffix) const {
  auto* p = try_find(suffix);
  LT_CHECK(p, "parameter '{}' is not part of this unit", suffix);
  return *p;
}

UnitLayout layer_unit_layout(const ModelConfig& c, int64_t layer) {
  Builder b;
  b.u.kind = UnitKind::Layer;
  b.u.layer = layer;
  b.prefix = c.text_prefix() + "layers." + std::to_string(layer) + ".";
  const int64_t H = c.hidden;
  b.add("input_layernorm.weight", {H}, false, false);
  for (auto& p : mixer_spec(c.kind(layer)).params(c)) b.add(p.suffix, p.shape, p.decay, p.matrix);
  b.add("post_attention_layernorm.weight", {H}, false, false);
  b.add("mlp.gate_proj.weight", {c.ffn, H}, true, true);
  b.add("mlp.up_proj.weight", {c.ffn, H}, true, true);
  b.add("mlp.down_proj.weight", {H, c.ffn}, true, true);
  return b.u;
}

UnitLayout embedding_unit_layout(const ModelConfig& c) {
  Builder b;
  b.u.kind = UnitKind::Embedding;
  b.prefix = c.text_prefix();
  b.add("embed_tokens.weight", {c.vocab, c.hidden}, true, true, true);
  return b.u;
}

UnitLayout head_unit_layout(const ModelConfig& c) {
  Builder b;
  b.u.kind = UnitKind::Head;
  b.prefix = c.text_prefix();
  b.add("norm.weight", {c.hidden}, false, false);
  b.prefix = "";
  if (!c.tied) b.add("lm_head.weight", {c.vocab, c.hidden}, true, true);
  return b.u;
}

ModelLayout model_layout(const ModelConfig& c) {
  ModelLayout m;
  m.units.push_back(embedding_unit_layout(c));
  for (int64_t i = 0; i < c.layers; ++i) m.units.push_back(layer_unit_layout(c, i));
  m.units.push_back(head_unit_layout(c));
  return m;
}

int64_t ModelLayout::max_layer_numel() const {
  int64_t m = 0;
  for (auto& u : units)
    if (u.kind == UnitKind::Layer) m = std::max(m, u.numel);
  return m;
}

int64_t ModelLayout::parameter_count() const {
  int64_t n = 0;
  for (auto& u : units)
    for (auto& p : u.params) n += p.numel;
  return n;
}

}  // namespace lt
