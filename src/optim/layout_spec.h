// Builds the optimizer's UnitSpec from a model unit layout (model/param_layout.h) and the state-format
// policy. Header-only: reads ParamInfo fields, so lt_optim does not link lt_model.
//   adamw      every tensor fp32
//   adamw8bit  every eligible tensor 8-bit: 2-D matrices except the input embedding (norms, biases stay
//              fp32), plus the embedding if q8_names has it (the planner's last-resort rung)
//   hybrid     fp32 except the tensors named in q8_names (the planner's choice; must be 2-D matrices)
// Groups: 0 = weight decay (ParamInfo.decay), 1 = no decay; see AdamWConfig::groups.
#pragma once
#include <set>
#include <string>

#include "core/error.h"
#include "model/param_layout.h"
#include "optim/optimizer.h"

namespace lt::optim {

enum class OptimizerKind { AdamW, AdamW8bit, Hybrid };

inline OptimizerKind parse_optimizer_kind(const std::string& s) {
  if (s == "adamw") return OptimizerKind::AdamW;
  if (s == "adamw8bit") return OptimizerKind::AdamW8bit;
  if (s == "hybrid") return OptimizerKind::Hybrid;
  fail("optimizer: expected one of adamw|adamw8bit|hybrid, got '{}'", s);
}

// The default 8-bit set (adamw8bit) and what may be 8-bit at all when named (any 2-D matrix).
inline bool q8_eligible(const ParamInfo& p) { return p.is_matrix && !p.is_embedding; }
inline bool q8_allowed(const ParamInfo& p) { return p.is_matrix; }

inline UnitSpec unit_spec_from_layout(const UnitLayout& lay, OptimizerKind kind,
                                      const std::set<std::string>* q8_names = nullptr) {
  UnitSpec u;
  u.numel = lay.numel;
  for (const ParamInfo& p : lay.params) {
    TensorSpec t;
    t.name = p.name;
    t.offset = p.offset;
    t.numel = p.numel;
    t.group = p.decay ? 0 : 1;
    bool q8 = kind == OptimizerKind::AdamW8bit && q8_eligible(p);
    if (kind != OptimizerKind::AdamW && q8_names && q8_names->count(p.name)) {
      LT_CHECK(q8_allowed(p), "optimizer: '{}' cannot use 8-bit state (only 2-D weights)", p.name);
      q8 = true;
    }
    t.format = q8 ? StateFormat::Q8 : StateFormat::F32;
    u.tensors.push_back(std::move(t));
  }
  return u;
}

}  // namespace lt::optim
