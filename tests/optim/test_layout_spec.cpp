// OptimizerKind -> per-tensor state formats and groups from a unit layout.
#include <gtest/gtest.h>

#include "optim/layout_spec.h"

using namespace lt;
using namespace lt::optim;

namespace {

UnitLayout toy_layer() {
  UnitLayout u;
  auto add = [&](const std::string& name, int64_t numel, bool decay, bool matrix, bool emb) {
    ParamInfo p;
    p.name = name;
    p.suffix = name;
    p.offset = u.numel;
    p.numel = numel;
    p.decay = decay;
    p.is_matrix = matrix;
    p.is_embedding = emb;
    u.params.push_back(p);
    u.numel += (numel + kParamAlign - 1) / kParamAlign * kParamAlign;
  };
  add("model.layers.0.input_layernorm.weight", 64, false, false, false);
  add("model.layers.0.self_attn.q_proj.weight", 64 * 64, true, true, false);
  add("model.layers.0.self_attn.q_proj.bias", 64, false, false, false);
  add("model.embed_tokens.weight", 100 * 64, true, true, true);
  return u;
}

}  // namespace

TEST(LayoutSpec, KindsChooseFormatsAndGroups) {
  UnitLayout lay = toy_layer();
  UnitSpec a = unit_spec_from_layout(lay, OptimizerKind::AdamW);
  UnitSpec q = unit_spec_from_layout(lay, OptimizerKind::AdamW8bit);
  ASSERT_EQ(a.tensors.size(), 4u);
  EXPECT_EQ(a.numel, lay.numel);
  for (auto& t : a.tensors) EXPECT_EQ(t.format, StateFormat::F32);
  // Only the non-embedding matrix goes 8-bit; norms and biases are group 1 (no decay).
  EXPECT_EQ(q.tensors[0].format, StateFormat::F32);
  EXPECT_EQ(q.tensors[1].format, StateFormat::Q8);
  EXPECT_EQ(q.tensors[2].format, StateFormat::F32);
  EXPECT_EQ(q.tensors[3].format, StateFormat::F32);
  EXPECT_EQ(q.tensors[0].group, 1);
  EXPECT_EQ(q.tensors[1].group, 0);
  EXPECT_EQ(q.tensors[2].group, 1);
  EXPECT_EQ(q.tensors[1].offset, lay.params[1].offset);
  std::set<std::string> names = {"model.layers.0.self_attn.q_proj.weight"};
  UnitSpec h = unit_spec_from_layout(lay, OptimizerKind::Hybrid, &names);
  EXPECT_EQ(h.tensors[1].format, StateFormat::Q8);
  UnitSpec h0 = unit_spec_from_layout(lay, OptimizerKind::Hybrid, nullptr);
  EXPECT_EQ(h0.tensors[1].format, StateFormat::F32);
  // The embedding is 8-bit only when named (the planner's last rung), under hybrid and adamw8bit alike;
  // a vector cannot be 8-bit; plain adamw ignores the names.
  names.insert("model.embed_tokens.weight");
  EXPECT_EQ(unit_spec_from_layout(lay, OptimizerKind::Hybrid, &names).tensors[3].format, StateFormat::Q8);
  EXPECT_EQ(unit_spec_from_layout(lay, OptimizerKind::AdamW8bit, &names).tensors[3].format, StateFormat::Q8);
  EXPECT_EQ(unit_spec_from_layout(lay, OptimizerKind::AdamW, &names).tensors[3].format, StateFormat::F32);
  names.insert("model.layers.0.self_attn.q_proj.bias");
  EXPECT_THROW(unit_spec_from_layout(lay, OptimizerKind::Hybrid, &names), lt::Error);
  EXPECT_EQ(parse_optimizer_kind("adamw8bit"), OptimizerKind::AdamW8bit);
  EXPECT_THROW(parse_optimizer_kind("sgd"), lt::Error);
  // State bytes: fp32 8 B/param, 8-bit 2 B/param + 8 B per 256-element block.
  EXPECT_EQ(state_bytes(1000, StateFormat::F32), 8000);
  EXPECT_EQ(state_bytes(1000, StateFormat::Q8), 2000 + 4 * 8);
  CpuAdamW opt({q}, AdamWConfig{});
  EXPECT_EQ(opt.state_bytes(), 8 * 64 + state_bytes(4096, StateFormat::Q8) + 8 * 64 + 8 * 6400);
}
