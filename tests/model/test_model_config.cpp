#include "../common/repo_path.h"
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/accounting.h"
#include "model/model_config.h"
#include "model/param_layout.h"

using nlohmann::json;
using namespace lt;

namespace {

// Message of the lt::Error thrown by f, or "" when nothing is thrown.
template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const lt::Error& e) {
    return e.what();
  }
  return "";
}

json qwen2_json() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "intermediate_size": 4864, "vocab_size": 151936, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_scaling": null, "tie_word_embeddings": true,
    "use_sliding_window": false, "sliding_window": 32768, "max_window_layers": 21,
    "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16", "initializer_range": 0.02})");
}

json qwen3_json() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": false,
    "head_dim": 128, "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 12288, "vocab_size": 151936, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000, "rope_scaling": null, "tie_word_embeddings": false, "eos_token_id": 151645})");
}

json llama31_json() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": false, "mlp_bias": false,
    "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "max_position_embeddings": 131072, "tie_word_embeddings": false, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}})");
}

}  // namespace

TEST(ModelConfig, PublishedParameterCounts) {
  EXPECT_EQ(parameter_count(preset_config("qwen2.5-0.5b")), 494032768);
  EXPECT_EQ(parameter_count(preset_config("qwen2.5-3b")), 3085938688);
  EXPECT_EQ(parameter_count(preset_config("qwen2.5-7b")), 7615616512);
  EXPECT_EQ(parameter_count(preset_config("qwen2.5-14b")), 14770033664);
  EXPECT_EQ(parameter_count(preset_config("qwen3-8b")), 8190735360);
  // The layout (what the trainer allocates) agrees with the closed formula.
  for (auto& n : preset_names()) {
    auto c = preset_config(n);
    EXPECT_EQ(model_layout(c).parameter_count(), parameter_count(c)) << n;
  }
  EXPECT_EQ(preset_config("qwen2.5-32b").layers, 64);
  EXPECT_EQ(preset_config("qwen2.5-72b").layers, 80);
}

TEST(ModelConfig, ParsesQwen2) {
  auto c = model_config_from_json(qwen2_json(), "q2.json");
  EXPECT_EQ(c.arch, Arch::Qwen2);
  EXPECT_TRUE(c.attn_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.tied);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.kv_heads, 2);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, "none");
  EXPECT_EQ(c.eos_token_id, 151645);
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_EQ(parameter_count(c), 494032768);
  // An explicit head_dim is honoured (transformers' Qwen2 attention reads it too).
  auto j = qwen2_json();
  j["head_dim"] = 128;
  EXPECT_EQ(model_config_from_json(j, "q2.json").q_dim(), 14 * 128);
  j["head_dim"] = nullptr;
  EXPECT_EQ(model_config_from_json(j, "q2.json").head_dim, 64);
}

TEST(ModelConfig, ParsesQwen3WithExplicitHeadDimAndOptionalBias) {
  auto j = qwen3_json();
  auto c = model_config_from_json(j, "q3.json");
  EXPECT_EQ(c.arch, Arch::Qwen3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attn_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(parameter_count(c), 8190735360);
  j["attention_bias"] = true;
  EXPECT_TRUE(model_config_from_json(j, "q3.json").attn_bias);
  // head_dim need not be hidden/heads
  j["head_dim"] = 64;
  EXPECT_EQ(model_config_from_json(j, "q3.json").q_dim(), 32 * 64);
}

TEST(ModelConfig, ParsesLlama3RopeScalingBothSpellings) {
  auto j = llama31_json();
  auto c = model_config_from_json(j, "l.json");
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_id, 128001);  // first of the list
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_DOUBLE_EQ(c.rms_eps, 1e-5);
  // old spelling "type"
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "llama3";
  EXPECT_EQ(model_config_from_json(j, "l.json").rope_scaling.type, "llama3");
  // transformers 5.x spelling: rope_parameters with rope_theta inside
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 250000.0}, {"factor", 32.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
  auto c2 = model_config_from_json(j, "l.json");
  EXPECT_DOUBLE_EQ(c2.rope_theta, 250000.0);
  EXPECT_DOUBLE_EQ(c2.rope_scaling.factor, 32.0);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1234.0}};
  auto c3 = model_config_from_json(j, "l.json");
  EXPECT_EQ(c3.rope_scaling.type, "none");
  EXPECT_DOUBLE_EQ(c3.rope_theta, 1234.0);
  j["attention_bias"] = true;
  EXPECT_TRUE(model_config_from_json(j, "l.json").attn_bias);
}

TEST(ModelConfig, RoundTripsThroughJson) {
  for (auto& n : preset_names()) {
    auto c = preset_config(n);
    auto j = model_config_to_json(c);
    auto d = model_config_from_json(json::parse(j.dump()), "rt");
    EXPECT_EQ(d.arch, c.arch) << n;
    EXPECT_EQ(d.hidden, c.hidden) << n;
    EXPECT_EQ(d.layers, c.layers) << n;
    EXPECT_EQ(d.heads, c.heads) << n;
    EXPECT_EQ(d.kv_heads, c.kv_heads) << n;
    EXPECT_EQ(d.head_dim, c.head_dim) << n;
    EXPECT_EQ(d.ffn, c.ffn) << n;
    EXPECT_EQ(d.vocab, c.vocab) << n;
    EXPECT_EQ(d.tied, c.tied) << n;
    EXPECT_EQ(d.attn_bias, c.attn_bias) << n;
    EXPECT_EQ(d.qk_norm, c.qk_norm) << n;
    EXPECT_DOUBLE_EQ(d.rms_eps, c.rms_eps) << n;
    EXPECT_DOUBLE_EQ(d.rope_theta, c.rope_theta) << n;
    EXPECT_EQ(d.rope_scaling.type, c.rope_scaling.type) << n;
    EXPECT_DOUBLE_EQ(d.rope_scaling.factor, c.rope_scaling.factor) << n;
    EXPECT_EQ(d.rope_scaling.original_max_position_embeddings, c.rope_scaling.original_max_position_embeddings) << n;
    EXPECT_EQ(d.max_position, c.max_position) << n;
    EXPECT_EQ(d.eos_token_id, c.eos_token_id) << n;
    EXPECT_EQ(d.bos_token_id, c.bos_token_id) << n;
    EXPECT_EQ(parameter_count(d), parameter_count(c)) << n;
    EXPECT_EQ(d.layer_kinds, c.layer_kinds) << n;
    EXPECT_EQ(d.linear.conv_dim(), c.linear.conv_dim()) << n;
    EXPECT_EQ(d.rotary_dim(), c.rotary_dim()) << n;
    EXPECT_EQ(d.attn_output_gate, c.attn_output_gate) << n;
    EXPECT_EQ(d.norm_plus_one, c.norm_plus_one) << n;
  }
}

TEST(ModelConfig, RejectsUnsupportedWithClearMessages) {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    std::vector<std::string> needles;
  };
  std::vector<Case> cases = {
      {"unknown arch", [](json& j) { j["architectures"] = {"MistralForCausalLM"}; },
       {"architectures", "MistralForCausalLM", "Qwen2ForCausalLM"}},
      {"unknown model_type", [](json& j) { j.erase("architectures"); j["model_type"] = "gemma"; },
       {"model_type", "gemma", "qwen3"}},
      {"mismatched type", [](json& j) { j["model_type"] = "llama"; }, {"model_type", "Qwen2ForCausalLM"}},
      {"no arch", [](json& j) { j.erase("architectures"); j.erase("model_type"); }, {"architectures", "model_type"}},
      {"yarn", [](json& j) { j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}}; },
       {"rope_scaling.rope_type", "yarn", "llama3"}},
      {"sliding", [](json& j) { j["use_sliding_window"] = true; }, {"use_sliding_window", "not supported"}},
      {"layer types", [](json& j) { j["layer_types"] = {"full_attention", "sliding_attention"}; },
       {"layer_types[1]", "sliding_attention"}},
      {"gelu", [](json& j) { j["hidden_act"] = "gelu"; }, {"hidden_act", "gelu", "silu"}},
      {"partial rope", [](json& j) { j["partial_rotary_factor"] = 0.5; }, {"partial_rotary_factor", "0.5"}},
      {"missing", [](json& j) { j.erase("hidden_size"); }, {"hidden_size", "missing", "integer"}},
      {"mistyped", [](json& j) { j["hidden_size"] = "896"; }, {"hidden_size", "expected integer", "got string"}},
      {"mistyped bool", [](json& j) { j["tie_word_embeddings"] = 1; },
       {"tie_word_embeddings", "expected boolean", "got integer"}},
      {"fractional", [](json& j) { j["vocab_size"] = 1.5; }, {"vocab_size", "expected integer", "number"}},
      {"negative", [](json& j) { j["num_hidden_layers"] = -1; }, {"num_hidden_layers", "positive"}},
      {"gqa", [](json& j) { j["num_key_value_heads"] = 3; }, {"num_key_value_heads", "does not divide"}},
      {"eps type", [](json& j) { j["rms_norm_eps"] = "small"; }, {"rms_norm_eps", "expected number"}},
      {"scaling type", [](json& j) { j["rope_scaling"] = 2; }, {"rope_scaling", "object"}},
  };
  for (auto& cs : cases) {
    auto j = qwen2_json();
    cs.edit(j);
    auto msg = error_of([&] { model_config_from_json(j, "/m/config.json"); });
    ASSERT_FALSE(msg.empty()) << cs.what << ": no error";
    EXPECT_NE(msg.find("/m/config.json"), std::string::npos) << cs.what << ": " << msg;
    for (auto& n : cs.needles) EXPECT_NE(msg.find(n), std::string::npos) << cs.what << ": '" << n << "' not in: " << msg;
  }
  auto j = llama31_json();
  j["mlp_bias"] = true;
  EXPECT_NE(error_of([&] { model_config_from_json(j, "x"); }).find("mlp_bias"), std::string::npos);
  j = llama31_json();
  j["rope_scaling"].erase("factor");
  EXPECT_NE(error_of([&] { model_config_from_json(j, "x"); }).find("rope_scaling.factor"), std::string::npos);
}

TEST(ModelConfig, LoadsFromDirectoryAndResolves) {
  namespace fs = std::filesystem;
  auto dir = fs::temp_directory_path() / ("lt_cfg_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream(dir / "config.json") << qwen3_json().dump(2);
  }
  auto c = load_model_config(dir);
  EXPECT_EQ(c.arch, Arch::Qwen3);
  EXPECT_EQ(resolve_model(dir.string()).hidden, 4096);
  EXPECT_EQ(resolve_model((dir / "config.json").string()).layers, 36);
  EXPECT_EQ(resolve_model("tiny-qwen2").hidden, 64);
  {
    std::ofstream(dir / "config.json") << "{ \"hidden_size\": ";
  }
  auto msg = error_of([&] { load_model_config(dir); });
  EXPECT_NE(msg.find("invalid JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
  fs::remove_all(dir);
  msg = error_of([&] { resolve_model("no-such-model"); });
  EXPECT_NE(msg.find("qwen2.5-7b"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { load_model_config(dir); }).find("cannot open"), std::string::npos);
}

// ---------------------------------------------------------------- Qwen3.5 / Qwen3.6 (hybrid)
namespace {
const std::filesystem::path kHf = lt::testing::repo_root() / "tests" / "fixtures" / "hf";

json qwen35_text() {
  return json::parse(R"({"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 64,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "intermediate_size": 96, "vocab_size": 300, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 16, "linear_value_head_dim": 24, "linear_conv_kernel_dim": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25}})");
}
}  // namespace

TEST(ModelConfig, ParsesQwen35TextConfigWithDefaultLayerTypes) {
  auto c = model_config_from_json(qwen35_text(), "q35");
  EXPECT_EQ(c.arch, Arch::Qwen3_5);
  EXPECT_FALSE(c.composite);
  ASSERT_EQ(c.layer_kinds.size(), 4u);  // full_attention_interval 4: D D D A
  EXPECT_EQ(c.kind(0), LayerKind::GatedDeltaNet);
  EXPECT_EQ(c.kind(3), LayerKind::Attention);
  EXPECT_TRUE(c.attn_output_gate && c.norm_plus_one && c.qk_norm);
  EXPECT_EQ(c.rotary_dim(), 8);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.linear.conv_dim(), 2 * 2 * 16 + 4 * 24);
  auto lay = layer_unit_layout(c, 0);
  EXPECT_EQ(lay.find("linear_attn.conv1d.weight").shape, (std::vector<int64_t>{160, 1, 4}));
  EXPECT_EQ(layer_unit_layout(c, 3).find("self_attn.q_proj.weight").shape, (std::vector<int64_t>{2 * 4 * 32, 64}));
}

TEST(ModelConfig, ParsesQwen35FixturesTextAndComposite) {
  auto odd = load_model_config(kHf / "qwen35_untied_odd");
  EXPECT_EQ(odd.kind(0), LayerKind::Attention);  // the fixture's list is not 3:1
  EXPECT_EQ(odd.count(LayerKind::GatedDeltaNet), 3);
  EXPECT_EQ(odd.linear.v_heads, 3);
  auto comp = load_model_config(kHf / "qwen35_composite");
  EXPECT_TRUE(comp.composite);
  EXPECT_TRUE(comp.tied);
  EXPECT_EQ(comp.text_prefix(), "model.language_model.");
  EXPECT_EQ(model_layout(comp).embedding().params[0].name, "model.language_model.embed_tokens.weight");
  // Written back verbatim (vision config included), so the directory loads as the class it came from.
  auto j = model_config_to_json(comp);
  EXPECT_EQ(j["architectures"][0], "Qwen3_5ForConditionalGeneration");
  EXPECT_TRUE(j.contains("vision_config"));
}

TEST(ModelConfig, Qwen35PresetsCountTheTextDecoder) {
  auto c = preset_config("qwen3.6-27b");
  EXPECT_EQ(c.count(LayerKind::GatedDeltaNet), 48);
  EXPECT_EQ(c.count(LayerKind::Attention), 16);
  // Independent count: embedding + LM head, per-kind layers (norms, mixer, MLP), final norm.
  const int64_t H = 5120, F = 17408, V = 248320, Q = 24 * 256, KV = 4 * 256, KD = 16 * 128, VD = 48 * 128;
  const int64_t common = 2 * H + 3 * H * F;
  const int64_t attn = H * 2 * Q + 2 * H * KV + 2 * 256 + Q * H;
  const int64_t conv_dim = 2 * KD + VD;
  const int64_t delta = H * conv_dim + H * VD + 2 * H * 48 + conv_dim * 4 + 2 * 48 + 128 + VD * H;
  const int64_t n = 2 * V * H + 16 * (common + attn) + 48 * (common + delta) + H;
  EXPECT_EQ(parameter_count(c), n);
  EXPECT_GT(parameter_count(c), 26'500'000'000);  // the paper's figures imply N = 26.9 B
  EXPECT_LT(parameter_count(c), 28'000'000'000);
  EXPECT_EQ(parameter_count(preset_config("qwen3.5-27b")), n);
}

TEST(ModelConfig, RejectsBadQwen35ConfigsNamingTheField) {
  struct Case {
    std::function<void(json&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["layer_types"] = {"linear_attention", "full_attention"}; },
       {"layer_types", "2 entries", "num_hidden_layers = 4"}},
      {[](json& j) { j["layer_types"] = {"linear_attention", "sliding_attention", "full_attention", "full_attention"}; },
       {"layer_types[1]", "sliding_attention"}},
      {[](json& j) { j["linear_num_value_heads"] = 3; }, {"linear_num_value_heads", "not a multiple", "2"}},
      {[](json& j) { j["num_key_value_heads"] = 3; }, {"num_key_value_heads", "does not divide"}},
      {[](json& j) { j["attention_bias"] = true; }, {"attention_bias"}},
      {[](json& j) { j["rope_parameters"]["rope_type"] = "yarn"; }, {"rope_parameters.rope_type", "yarn"}},
      {[](json& j) { j["linear_key_head_dim"] = "128"; }, {"linear_key_head_dim", "expected integer"}},
  };
  for (auto& cs : cases) {
    json j = qwen35_text();
    cs.edit(j);
    const std::string msg = error_of([&] { model_config_from_json(j, "/m/config.json"); });
    ASSERT_FALSE(msg.empty()) << j.dump();
    EXPECT_NE(msg.find("/m/config.json"), std::string::npos) << msg;
    for (auto& n : cs.needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
  // A composite config without its text config; a nested field named with its path.
  json comp = {{"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"model_type", "qwen3_5"}};
  EXPECT_NE(error_of([&] { model_config_from_json(comp, "c.json"); }).find("text_config"), std::string::npos);
  comp["text_config"] = qwen35_text();
  comp["text_config"]["hidden_size"] = -4;
  EXPECT_NE(error_of([&] { model_config_from_json(comp, "c.json"); }).find("text_config.hidden_size"),
            std::string::npos);
}
