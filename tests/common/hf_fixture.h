// Reading the HF transformers fixtures (tests/fixtures/hf, made by tools/make_hf_fixtures.py):
// shared by the CPU parity tests (tests/ops) and the CUDA bf16 step tests (tests/gpu).
#pragma once
#include "../common/repo_path.h"
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace lt::testing {

inline const std::filesystem::path kHfFixtures = lt::testing::repo_root() / "tests" / "fixtures" / "hf";

// The command (from the repo root) that makes fixture `name`.
inline std::string hf_fixture_command(const std::string& name) {
  const bool hybrid = name.rfind("qwen35_", 0) == 0;
  return std::string("python3 tools/") + (hybrid ? "make_hf_fixtures_qwen35.py" : "make_hf_fixtures.py") + " --only " + name;
}

// Success when dir holds fixture.safetensors; else a failure naming dir and the command that makes it.
inline ::testing::AssertionResult hf_fixture_present(const std::filesystem::path& dir) {
  if (std::filesystem::exists(dir / "fixture.safetensors")) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "HF fixture missing: " << dir.string() << "/fixture.safetensors; make it with `"
                                       << hf_fixture_command(dir.filename().string()) << "` (torch + transformers)";
}

// An I64 tensor (input_ids, labels) as int32.
inline std::vector<int32_t> read_ids(const SafetensorsFile& f, const std::string& name) {
  const StTensor* t = f.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  EXPECT_EQ(t->dtype, "I64") << name;
  std::vector<int32_t> out(static_cast<size_t>(t->numel()));
  const uint8_t* p = f.raw(*t);
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t v;
    std::memcpy(&v, p + 8 * i, 8);
    out[i] = int32_t(v);
  }
  return out;
}

// Any float tensor as fp32.
inline std::vector<float> read_f32(const SafetensorsFile& f, const std::string& name) {
  const StTensor* t = f.find(name);
  if (!t) ADD_FAILURE() << "tensor " << name << " missing from " << f.path();
  if (!t) return {};
  std::vector<float> out(static_cast<size_t>(t->numel()));
  f.read_f32(*t, out.data());
  return out;
}

}  // namespace lt::testing
