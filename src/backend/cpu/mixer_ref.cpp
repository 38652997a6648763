// The mixer of a layer by its kind (mixer_ref.h): the one place the CPU reference dispatches on it.
#include "backend/cpu/mixer_ref.h"

namespace lt::cpu {

std::unique_ptr<MixerRef> make_mixer_ref(const ModelConfig& c, const UnitLayout& lay, const float* w, float* dw,
                                         int64_t S) {
  switch (c.kind(lay.layer)) {
    case LayerKind::Attention: return make_attention_ref(c, lay, w, dw, S);
    case LayerKind::GatedDeltaNet: return make_deltanet_ref(c, lay, w, dw, S);
  }
  return nullptr;
}

void mixer_decode_step(const ModelConfig& c, const UnitLayout& lay, const float* w, const float* h, int64_t n,
                       float* out, MixerCache* const* caches) {
  if (c.kind(lay.layer) == LayerKind::GatedDeltaNet) return deltanet_decode_step(c, lay, w, h, n, out, caches);
  attention_decode_step(c, lay, w, h, n, out, caches);
}

}  // namespace lt::cpu
