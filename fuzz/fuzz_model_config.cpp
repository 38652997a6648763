// libFuzzer target: config.json text -> ModelConfig. Invalid input must raise lt::Error (or be
// rejected as JSON); an accepted config must round-trip through model_config_to_json.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
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
