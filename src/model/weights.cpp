#include "model/weights.h"

#include "core/error.h"

namespace lt {

ModelWeights make_weights(const ModelConfig& c) {
  ModelWeights w;
  w.config = c;
  w.layout = model_layout(c);
  w.units.reserve(w.layout.units.size());
  for (auto& u : w.layout.units) w.units.emplace_back(size_t(u.numel), 0.0f);
  return w;
}

std::pair<int, const ParamInfo*> ModelWeights::find(const std::string& name) const {
  // Decoder-layer names go straight to their unit; others are in the embedding or head unit.
  const std::string lp = config.text_prefix() + "layers.";
  if (name.rfind(lp, 0) == 0) {
    size_t dot = name.find('.', lp.size());
    if (dot == std::string::npos) return {-1, nullptr};
    int64_t idx = -1;
    try {
      idx = std::stoll(name.substr(lp.size(), dot - lp.size()));
    } catch (...) {
      return {-1, nullptr};
    }
    if (idx < 0 || idx >= config.layers) return {-1, nullptr};
    auto* p = layout.layer(idx).try_find(name.substr(dot + 1));
    if (!p || p->name != name) return {-1, nullptr};
    return {int(idx + 1), p};
  }
  for (int u : {0, int(layout.units.size()) - 1})
    for (auto& p : layout.units[size_t(u)].params)
      if (p.name == name) return {u, &p};
  return {-1, nullptr};
}

float* ModelWeights::tensor(const std::string& name) {
  auto [u, p] = find(name);
  LT_CHECK(p, "model has no tensor '{}'", name);
  return units[size_t(u)].data() + p->offset;
}

const float* ModelWeights::tensor(const std::string& name) const {
  return const_cast<ModelWeights*>(this)->tensor(name);
}

}  // namespace lt
