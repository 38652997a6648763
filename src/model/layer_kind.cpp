#include "model/layer_kind.h"

#include "model/mixer.h"

namespace lt {

const char* layer_kind_hf_name(LayerKind k) {
  switch (k) {
    case LayerKind::Attention: return "full_attention";
    case LayerKind::GatedDeltaNet: return "linear_attention";
  }
  return "?";
}

const char* layer_kind_short_name(LayerKind k) {
  switch (k) {
    case LayerKind::Attention: return "attention";
    case LayerKind::GatedDeltaNet: return "deltanet";
  }
  return "?";
}

bool parse_layer_kind(const std::string& s, LayerKind* out) {
  for (LayerKind k : {LayerKind::Attention, LayerKind::GatedDeltaNet})
    if (s == layer_kind_hf_name(k)) {
      *out = k;
      return true;
    }
  return false;
}

extern const MixerSpec kAttentionMixer, kDeltaNetMixer;

const MixerSpec& mixer_spec(LayerKind k) {
  return k == LayerKind::GatedDeltaNet ? kDeltaNetMixer : kAttentionMixer;
}

}  // namespace lt
