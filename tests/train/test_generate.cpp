#include "../common/repo_path.h"
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "backend/cpu/reference.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "model/init.h"
#include "train/generate.h"

using namespace lt;
using namespace lt::train;

namespace {
ModelWeightsView view(const ModelWeights& m) { return view_of(m); }
}  // namespace

// The incremental (KV-cache, batched) path must pick the same tokens as a full forward over the
// growing sequence, for every architecture variant.
class GenerateArch : public ::testing::TestWithParam<const char*> {};

TEST_P(GenerateArch, KvCacheMatchesFullForward) {
  ModelConfig c = preset_config(GetParam());
  ModelWeights m = random_model(c, 1234);
  auto v = view(m);
  std::vector<std::vector<int32_t>> prompts = {{1, 5, 9, 200}, {7}, {3, 3, 3, 3, 3, 3, 3, 42, 17}, {}};
  for (int i = 0; i < 100; ++i) prompts.back().push_back(int32_t((i * 37 + 11) % 250));  // spans two delta-rule chunks
  GenerateOptions opt;
  opt.max_new_tokens = 6;
  opt.batch_size = 2;  // two batches: exercises the batching and a partial batch
  auto gen = greedy_generate(v, prompts, opt);
  ASSERT_EQ(gen.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(gen[i].size(), 6u);
    std::vector<int32_t> seq = prompts[i];
    seq.insert(seq.end(), gen[i].begin(), gen[i].end() - 1);
    auto logits = forward_logits(v, seq);
    for (size_t t = 0; t < gen[i].size(); ++t) {
      const float* row = &logits[(prompts[i].size() - 1 + t) * size_t(c.vocab)];
      int32_t best = int32_t(std::max_element(row, row + c.vocab) - row);
      std::vector<float> sorted(row, row + c.vocab);
      std::sort(sorted.rbegin(), sorted.rend());
      if (sorted[0] - sorted[1] > 1e-4f) {
        EXPECT_EQ(gen[i][t], best) << "prompt " << i << " token " << t;
      }
    }
  }
}

// The composed forward equals the layer-level CPU reference (reference.h).
TEST_P(GenerateArch, ForwardMatchesReference) {
  ModelConfig c = preset_config(GetParam());
  ModelWeights m = random_model(c, 99);
  std::vector<int32_t> ids = {4, 8, 15, 16, 23, 42, 7};
  const int64_t T = int64_t(ids.size());
  std::vector<float> x(size_t(T * c.hidden)), y(x.size());
  cpu::embed_forward(c, m.unit(0), ids.data(), T, x.data());
  cpu::SeqGeometry g{1, T, nullptr, nullptr};
  for (int64_t l = 0; l < c.layers; ++l) {
    cpu::layer_forward(c, m.layout.layer(l), m.unit(size_t(l + 1)), g, x.data(), y.data());
    x.swap(y);
  }
  std::vector<int64_t> rows(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) rows[size_t(i)] = i;
  std::vector<float> ref(size_t(T * c.vocab));
  const float* lm = c.tied ? m.unit(0) : m.tensor("lm_head.weight");
  cpu::head_logits(c, m.layout.head(), m.unit(size_t(c.layers + 1)), lm, x.data(), rows.data(), T, ref.data());
  auto got = forward_logits(view(m), ids);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-4f * (1 + std::abs(ref[i]))) << i;
}

TEST(Generate, StopsAtStopToken) {
  ModelConfig c = preset_config("tiny-qwen2");
  ModelWeights m = random_model(c, 5);
  auto v = view(m);
  GenerateOptions opt;
  opt.max_new_tokens = 5;
  auto free_run = greedy_generate(v, {{1, 2, 3}}, opt)[0];
  opt.stop_ids = {free_run[1]};
  auto stopped = greedy_generate(v, {{1, 2, 3}}, opt)[0];
  size_t first = size_t(std::find(free_run.begin(), free_run.end(), free_run[1]) - free_run.begin());
  EXPECT_EQ(stopped.size(), first + 1);
}

INSTANTIATE_TEST_SUITE_P(Archs, GenerateArch,
                         ::testing::Values("tiny-qwen2", "tiny-qwen3", "tiny-llama3", "tiny-qwen35"));

// Hybrid models: greedy tokens equal HF generate() (cache on: HF's recurrent step and conv update) on
// the Qwen3.5 fixtures (tools/make_hf_fixtures_qwen35.py).
class GenerateHf : public ::testing::TestWithParam<const char*> {};

TEST_P(GenerateHf, GreedyTokensEqualHf) {
  const auto dir = lt::testing::repo_root() / "tests" / "fixtures" / "hf" / GetParam();
  ModelWeights m = load_model(dir);
  SafetensorsFile fx(dir / "fixture.safetensors");
  auto ints = [&](const char* name) {
    const StTensor* t = fx.find(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<int32_t> out(static_cast<size_t>(t ? t->numel() : 0));
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t v;
      std::memcpy(&v, fx.raw(*t) + 8 * i, 8);
      out[i] = int32_t(v);
    }
    return out;
  };
  const auto prompt = ints("gen.prompt"), want = ints("gen.tokens");
  GenerateOptions opt;
  opt.max_new_tokens = int64_t(want.size());
  auto got = greedy_generate(view(m), {prompt}, opt)[0];
  EXPECT_EQ(got, want) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Qwen35, GenerateHf, ::testing::Values("qwen35_tied_3to1", "qwen35_untied_odd", "qwen35_hd128"));
