// Seeded random initialisation like HF's _init_weights: linear and embedding weights ~ N(0,
// initializer_range), biases 0, RMSNorm weights 1, the pad token's embedding row 0.
// Deterministic per (seed, tensor name, element index): independent of unit order and of the
// thread count, so any subset of units can be initialised on its own and gives the same values.
#pragma once
#include <cstdint>

#include "model/model_config.h"
#include "model/param_layout.h"
#include "model/weights.h"

namespace lt {

// Fills one unit's flat buffer (u.numel floats); padding elements are set to 0.
void init_unit(const ModelConfig& c, const UnitLayout& u, float* buf, uint64_t seed, int threads = 0);
// Elements [offset, offset + count) of what init_unit writes, into out[0, count): a unit in pieces through a bounded
// buffer (the 27B shape's embedding is 5 GiB in fp32).
void init_unit_part(const ModelConfig& c, const UnitLayout& u, int64_t offset, int64_t count, float* out, uint64_t seed,
                    int threads = 0);
// All units of w. threads = 0: hardware concurrency.
void init_weights(ModelWeights& w, uint64_t seed, int threads = 0);
ModelWeights random_model(const ModelConfig& c, uint64_t seed, int threads = 0);

}  // namespace lt
