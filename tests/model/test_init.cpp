#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/init.h"
#include "model/weights.h"

using namespace lt;

TEST(Init, HfLikeDistribution) {
  auto c = preset_config("tiny-qwen2");
  c.pad_token_id = 5;
  auto w = random_model(c, 7);
  ASSERT_EQ(w.num_units(), size_t(c.layers + 2));
  // Norms are 1, biases 0.
  const float* n = w.tensor("model.layers.1.input_layernorm.weight");
  for (int i = 0; i < c.hidden; ++i) EXPECT_EQ(n[i], 1.0f);
  const float* b = w.tensor("model.layers.0.self_attn.k_proj.bias");
  for (int i = 0; i < c.kv_dim(); ++i) EXPECT_EQ(b[i], 0.0f);
  EXPECT_EQ(w.tensor("model.norm.weight")[3], 1.0f);
  // Embedding ~ N(0, 0.02) apart from the zero pad row.
  const float* e = w.tensor("model.embed_tokens.weight");
  double s = 0, s2 = 0;
  int64_t N = c.vocab * c.hidden;
  for (int64_t i = 0; i < N; ++i) {
    s += e[i];
    s2 += double(e[i]) * e[i];
  }
  for (int i = 0; i < c.hidden; ++i) EXPECT_EQ(e[5 * c.hidden + i], 0.0f);
  double mean = s / N, sd = std::sqrt(s2 / N - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(sd, 0.02 * std::sqrt(1.0 - 1.0 / c.vocab), 0.0005);
  // Padding between tensors stays zero.
  auto& u = w.layout.layer(0);
  auto& q = u.find("self_attn.q_proj.bias");
  for (int64_t i = q.offset + q.numel; i < q.offset + 64 * ((q.numel + 63) / 64); ++i) EXPECT_EQ(w.unit(1)[i], 0.0f);
}

TEST(Init, DeterministicAndIndependentOfThreadsAndOrder) {
  auto c = preset_config("tiny-qwen3");
  c.vocab = 40000;  // large enough that the embedding fill is split across threads
  auto a = random_model(c, 1, 1);
  auto b = random_model(c, 1, 5);
  for (size_t u = 0; u < a.num_units(); ++u) EXPECT_EQ(a.units[u], b.units[u]) << "unit " << u;
  // A unit on its own gives the same values.
  std::vector<float> one(size_t(a.layout.units[2].numel), 9.0f);
  init_unit(c, a.layout.units[2], one.data(), 1);
  EXPECT_EQ(one, a.units[2]);
  // Different seeds and different layers differ.
  auto d = random_model(c, 2, 1);
  EXPECT_NE(a.units[1], d.units[1]);
  EXPECT_NE(a.tensor("model.layers.0.mlp.up_proj.weight")[0], a.tensor("model.layers.1.mlp.up_proj.weight")[0]);
}

TEST(Init, AUnitInPiecesIsTheWholeUnit) {
  for (const char* preset : {"tiny-qwen3", "tiny-qwen35"}) {
    auto c = preset_config(preset);
    c.vocab = 40000;  // the embedding's fill split across threads
    c.pad_token_id = 7;
    const ModelLayout layout = model_layout(c);
    for (const UnitLayout& u : {layout.units[0], layout.units[1]}) {
      std::vector<float> whole(size_t(u.numel));
      init_unit(c, u, whole.data(), 3, 4);
      // Odd piece sizes split Box-Muller pairs, tensors, the pad row and the threads' slices at every place.
      for (int64_t piece : {int64_t(1), int64_t(7), int64_t(1001), int64_t(1) << 20}) {
        std::vector<float> parts(size_t(u.numel), -1.0f);
        for (int64_t off = 0; off < u.numel; off += piece)
          init_unit_part(c, u, off, std::min(piece, u.numel - off), parts.data() + off, 3, piece > 5000 ? 3 : 1);
        ASSERT_EQ(parts, whole) << preset << " unit (layer " << u.layer << ") " << " pieces of " << piece;
      }
    }
  }
}

TEST(Weights, FindByName) {
  auto w = make_weights(preset_config("tiny-llama3"));
  auto [u, p] = w.find("model.layers.1.mlp.down_proj.weight");
  EXPECT_EQ(u, 2);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->shape, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(w.find("lm_head.weight").first, 3);
  EXPECT_EQ(w.find("model.embed_tokens.weight").first, 0);
  EXPECT_EQ(w.find("embed_tokens.weight").second, nullptr);  // full HF names only
  EXPECT_EQ(w.find("model.layers.2.mlp.down_proj.weight").second, nullptr);
  EXPECT_EQ(w.find("model.layers.x.mlp.down_proj.weight").second, nullptr);
  EXPECT_EQ(w.find("model.layers.0.self_attn.q_proj.bias").second, nullptr);  // llama: no bias
  EXPECT_THROW(w.tensor("nope"), lt::Error);
}

TEST(Init, ShapeOfTheDistributionIsNormal) {
  auto c = preset_config("tiny-llama3");
  c.vocab = 20000;  // 1.28M samples
  c.initializer_range = 0.5;
  auto u = embedding_unit_layout(c);
  std::vector<float> buf(size_t(u.numel));
  init_unit(c, u, buf.data(), 42, 2);
  const int64_t N = c.vocab * c.hidden;
  double m2 = 0, m4 = 0, within1 = 0, within2 = 0, mean = 0;
  for (int64_t i = 0; i < N; ++i) {
    double x = buf[size_t(i)] / 0.5;
    mean += x;
    m2 += x * x;
    m4 += x * x * x * x;
    within1 += std::fabs(x) < 1.0;
    within2 += std::fabs(x) < 2.0;
  }
  mean /= N;
  m2 /= N;
  m4 /= N;
  EXPECT_NEAR(mean, 0.0, 0.004);
  EXPECT_NEAR(m2, 1.0, 0.006);
  EXPECT_NEAR(m4 / (m2 * m2), 3.0, 0.05);     // kurtosis of a normal
  EXPECT_NEAR(within1 / N, 0.682689, 0.003);  // P(|x| < 1 sigma)
  EXPECT_NEAR(within2 / N, 0.954500, 0.002);  // P(|x| < 2 sigma)
}
