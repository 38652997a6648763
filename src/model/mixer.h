// The per-kind part of a decoder layer (model/layer_kind.h): the token mixer's parameters, FLOPs,
// saved internals and workspace. One implementation file per kind (mixer_attention.cpp,
// mixer_deltanet.cpp); the layer layout (param_layout.cpp) and the accounting (accounting.cpp) add
// the parts every kind shares (two RMSNorms, the residuals, the SwiGLU MLP). docs/model.md and
// docs/metrics.md give the formulas; keep them in step.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/layer_kind.h"
#include "model/model_config.h"

namespace lt {

// One parameter tensor of a mixer, named within the layer ("self_attn.q_proj.weight").
struct ParamDecl {
  std::string suffix;
  std::vector<int64_t> shape;
  bool decay = true;    // weight decay applies (not for norms, biases, decay/step gates)
  bool matrix = false;  // 2-D projection: 2 FLOPs per element per token, eligible for 8-bit state
};

// Costs of one mixer over tokens = batch * seq rows (projection FLOPs are counted from the matrix
// parameters by the caller; these are the rest).
struct MixerCost {
  double core_flops_fwd = 0;   // attention scores + weighted sum (causal), or conv + the delta rule
  double seq_flops_fwd = 0;    // the part of core_flops_fwd that 6 N does not count: attention's QK^T and PV,
                               // or the delta rule (the conv's weights are parameters: 6 N counts the conv)
  int64_t saved_act = 0;       // saved internals per token, elements in the activation dtype
  int64_t saved_f32 = 0;       // saved internals per token, fp32 elements (norm/softmax statistics, ...)
  int64_t bwd_act = 0;         // backward transient per token in the activation dtype (gradients of internals)
  int64_t bwd_f32 = 0;         // backward transient per token in fp32 (accumulators, recurrent states)
};

struct MixerSpec {
  LayerKind kind;
  const char* hf_module;  // "self_attn", "linear_attn"
  std::vector<ParamDecl> (*params)(const ModelConfig& c);
  MixerCost (*cost)(const ModelConfig& c, int64_t batch, int64_t seq);
};

const MixerSpec& mixer_spec(LayerKind k);

// Chunk length of the chunked delta rule (the CPU reference's and the FLOP count's).
constexpr int64_t kDeltaRuleChunk = 64;

}  // namespace lt
