// Qwen3.5/3.6 hybrid test models for the GPU tests (test_hybrid.cpp, test_hybrid_decode.cpp).
#pragma once
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt::gputest {

// Hybrid shapes: "hd64" (flash attention at head_dim 64, Dk = Dv = 32), "hd128" (flash at 128, linear
// heads of 128 with a GQA ratio 3 and conv 3), "hd256" (the 27B head_dim: flash on sm_90, else the
// generic attention; linear value heads of 64 and key heads of 128). "hd64_h72": hd64 at hidden 72, where the
// layout's 64-element alignment pads in_proj_b (4 x 72 entries), so the four input projections are not one
// matrix and the Gated DeltaNet mixer runs them as four GEMMs on its buffer's column slices.
inline ModelConfig hybrid_config(const std::string& kind) {
  ModelConfig c;
  c.name = "hybrid-" + kind;
  c.arch = Arch::Qwen3_5;
  c.hidden = 256;
  c.layers = 2;
  c.ffn = 512;
  c.vocab = 1000;
  c.rms_eps = 1e-6;
  c.rope_theta = 1e7;
  c.qk_norm = true;
  c.attn_output_gate = true;
  c.norm_plus_one = true;
  c.partial_rotary = 0.25;
  if (kind == "hd64" || kind == "hd64_h72") {
    c.heads = 4, c.kv_heads = 2, c.head_dim = 64;
    c.linear = LinearAttnConfig{2, 4, 32, 32, 4};
    if (kind == "hd64_h72") c.hidden = 72;
  } else if (kind == "hd128") {
    c.heads = 2, c.kv_heads = 1, c.head_dim = 128;
    c.linear = LinearAttnConfig{1, 3, 128, 128, 3};
  } else {
    c.heads = 4, c.kv_heads = 1, c.head_dim = 256;
    c.linear = LinearAttnConfig{2, 4, 128, 64, 4};
  }
  c.layer_kinds = {LayerKind::GatedDeltaNet, LayerKind::Attention};
  return c;
}

// Random unit weights rounded to bf16: (1 + w) norms w ~ N(0, 0.1); the gated norm's plain weight near
// 1; matrices ~ N(0, 0.05); conv taps ~ N(0, 0.3); A_log = log of U(1, 16); dt_bias ~ N(0, 0.5).
inline std::vector<float> unit_weights(const UnitLayout& lay, std::mt19937& rng) {
  std::vector<float> w(sz(lay.numel), 0.f);
  for (auto& p : lay.params) {
    std::vector<float> v;
    if (p.suffix == "linear_attn.norm.weight") {
      v = randn(sz(p.numel), rng, 0.1f, 1.f);
    } else if (p.suffix.find("norm") != std::string::npos) {
      v = randn(sz(p.numel), rng, 0.1f, 0.f);
    } else if (p.suffix.find("conv1d") != std::string::npos) {
      v = randn(sz(p.numel), rng, 0.3f);
    } else if (p.suffix.find("A_log") != std::string::npos) {
      std::uniform_real_distribution<float> u(1.f, 16.f);
      for (int64_t i = 0; i < p.numel; ++i) v.push_back(std::log(u(rng)));
    } else if (p.suffix.find("dt_bias") != std::string::npos) {
      v = randn(sz(p.numel), rng, 0.5f);
    } else {
      v = randn(sz(p.numel), rng, 0.05f);
    }
    std::copy(v.begin(), v.end(), w.begin() + p.offset);
  }
  return round_bf16(w);
}

}  // namespace lt::gputest
