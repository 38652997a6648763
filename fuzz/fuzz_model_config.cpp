// libFuzzer target: JSON text -> ModelConfig (config.json) and -> (tensor, shard) pairs
// (model.safetensors.index.json). Invalid input must raise lt::Error (or be rejected as JSON); an
// accepted config must round-trip through model_config_to_json; accepted shard names are plain.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/model_io.h"
#include "model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    for (auto& [tensor, shard] : lt::parse_safetensors_index(std::string(reinterpret_cast<const char*>(data), size), "fuzz"))
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "..") std::abort();
  } catch (const lt::Error&) {
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  lt::ModelConfig c;
  try {
    c = lt::model_config_from_json(j, "fuzz");
  } catch (const lt::Error&) {
    return 0;
  }
  auto d = lt::model_config_from_json(lt::model_config_to_json(c), "roundtrip");
  if (d.hidden != c.hidden || d.layers != c.layers || d.head_dim != c.head_dim || d.arch != c.arch ||
      d.tied != c.tied || d.attn_bias != c.attn_bias || d.rope_scaling.type != c.rope_scaling.type)
    std::abort();
  return 0;
}
