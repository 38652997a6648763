// The token mixer of a decoder layer on the CPU reference, one implementation per layer kind
// (mixer_attention_ref.cpp, mixer_deltanet_ref.cpp). reference_layer.cpp owns what every kind shares
// (the two RMSNorms, residuals, MLP) and calls the mixer through this interface, one sample at a time.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt::cpu {

// Geometry of one sample: RoPE positions [S] (never null) and packed-segment ids [S] (null: one segment).
struct SampleGeo {
  const int32_t* pos;
  const int32_t* seg;
};

// Greedy-decoding state of one sequence in one layer (infer/generate.cpp).
struct MixerCache {
  std::vector<float> k, v;         // attention: keys after norm + RoPE and values, [capacity, kv_dim]
  std::vector<float> conv, state;  // Gated DeltaNet: conv window [conv_dim, K-1], recurrent state [Hv, Dk, Dv]
  int64_t len = 0;                 // rows of the sequence seen so far
};

class MixerRef {
 public:
  virtual ~MixerRef() = default;
  // out [S, hidden] = mixer(h) for one sample; h is the layer's normalised input. Keeps the internals
  // that backward() needs.
  virtual void forward(const SampleGeo& sg, const float* h, float* out) = 0;
  // After forward() on the same sample: dh [S, hidden] WRITTEN, the mixer's weight gradients ACCUMULATED.
  virtual void backward(const SampleGeo& sg, const float* h, const float* dout, float* dh) = 0;
  // forward() of a prompt (one segment, positions 0..S-1) that also leaves the sequence's decoding
  // state in cache; capacity: rows the KV cache must hold (prompt + new tokens).
  virtual void prefill(const SampleGeo& sg, const float* h, float* out, MixerCache& cache, int64_t capacity) = 0;
};

// One new row for each of n sequences: out [n, hidden] = mixer(h [n, hidden]), row r at position
// caches[r]->len of its sequence; advances every cache. Projections run over the n rows at once.
void mixer_decode_step(const ModelConfig& c, const UnitLayout& lay, const float* w, const float* h, int64_t n,
                       float* out, MixerCache* const* caches);
void attention_decode_step(const ModelConfig& c, const UnitLayout& lay, const float* w, const float* h, int64_t n,
                           float* out, MixerCache* const* caches);
void deltanet_decode_step(const ModelConfig& c, const UnitLayout& lay, const float* w, const float* h, int64_t n,
                          float* out, MixerCache* const* caches);

// The mixer of layer lay.layer, for samples of S rows; w / dw are the layer unit's flat weights and
// gradient (dw may be null when only forward() is used).
std::unique_ptr<MixerRef> make_mixer_ref(const ModelConfig& c, const UnitLayout& lay, const float* w, float* dw,
                                         int64_t S);
std::unique_ptr<MixerRef> make_attention_ref(const ModelConfig& c, const UnitLayout& lay, const float* w, float* dw,
                                             int64_t S);
std::unique_ptr<MixerRef> make_deltanet_ref(const ModelConfig& c, const UnitLayout& lay, const float* w, float* dw,
                                            int64_t S);

}  // namespace lt::cpu
