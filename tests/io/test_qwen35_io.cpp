// Qwen3.5 composite checkpoints (Qwen3_5ForConditionalGeneration, fixture made by
// tools/make_hf_fixtures_qwen35.py): text weights under model.language_model, a vision tower and MTP
// tensors lazytrain does not train, all bf16. In: loaded with the right names and values; out: the
// vision/MTP tensors come back byte-identical with their dtype, the config as it was.
#include "../common/repo_path.h"
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/reference.h"
#include "backend/cpu/reference_model.h"
#include "core/error.h"
#include "io/model_io.h"
#include "io/safetensors.h"

using namespace lt;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path kComposite = lt::testing::repo_root() / "tests" / "fixtures" / "hf" / "qwen35_composite";

fs::path tmpdir(const std::string& tag) {
  auto d = fs::temp_directory_path() / ("lt_q35io_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

// Raw bytes and dtype of every tensor of a model directory.
std::map<std::string, std::pair<std::string, std::string>> raw_tensors(const fs::path& dir) {
  TensorStore st(dir);
  std::map<std::string, std::pair<std::string, std::string>> out;
  for (auto& n : st.names()) {
    auto* r = st.find(n);
    const auto* p = reinterpret_cast<const char*>(r->file->raw(*r->tensor));
    out[n] = {r->tensor->dtype, std::string(p, size_t(r->tensor->numel()) * r->tensor->elem_size)};
  }
  return out;
}

}  // namespace

TEST(Qwen35Io, LoadsCompositeAndMatchesHfLoss) {
  ModelWeights w = load_model(kComposite);
  EXPECT_TRUE(w.config.composite);
  EXPECT_EQ(w.layout.layer(0).params[0].name, "model.language_model.layers.0.input_layernorm.weight");
  SafetensorsFile fx(kComposite / "fixture.safetensors");
  const StTensor* idt = fx.find("input_ids");
  ASSERT_NE(idt, nullptr);
  std::vector<int32_t> ids(size_t(idt->numel())), labels(ids.size()), targets(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    int64_t a, b;
    std::memcpy(&a, fx.raw(*idt) + 8 * i, 8);
    std::memcpy(&b, fx.raw(*fx.find("labels")) + 8 * i, 8);
    ids[i] = int32_t(a);
    labels[i] = int32_t(b);
  }
  cpu::SeqGeometry g{idt->shape[0], idt->shape[1], nullptr, nullptr};
  cpu::shift_labels(labels.data(), g, targets.data());
  cpu::UnitBuffers grads(w.layout);
  std::vector<const float*> ws;
  for (auto& u : w.units) ws.push_back(u.data());
  auto st = cpu::model_forward_backward(w.config, w.layout, ws, ids.data(), targets.data(), g, grads.ptrs());
  float hf = 0;
  fx.read_f32(*fx.find("loss"), &hf);
  EXPECT_LE(std::fabs(st.loss - hf) / hf, 1e-5) << st.loss << " vs HF " << hf;
}

TEST(Qwen35Io, SavePassesVisionAndMtpThroughUnchanged) {
  ModelWeights w = load_model(kComposite);
  const auto src = raw_tensors(kComposite);
  ASSERT_TRUE(src.count("mtp.fc.weight"));
  int visual = 0;
  for (auto& [n, v] : src) visual += n.rfind("model.visual.", 0) == 0;
  ASSERT_GT(visual, 0);
  for (int64_t shard : {int64_t(5) << 30, int64_t(64) << 10}) {  // one file, and sharded with an index
    auto d = tmpdir("out" + std::to_string(shard));
    SaveOptions so;
    so.dtype = DType::BF16;
    so.max_shard_bytes = shard;
    so.passthrough_from = kComposite;
    save_model(d, w, so);
    const auto out = raw_tensors(d);
    EXPECT_EQ(out.size(), src.size());
    for (auto& [n, v] : src) {
      ASSERT_TRUE(out.count(n)) << n << " missing from the output";
      EXPECT_EQ(out.at(n).first, v.first) << n << ": dtype";
      // bf16 -> fp32 -> bf16 is exact, so the trained tensors are byte-identical too before training.
      EXPECT_TRUE(out.at(n).second == v.second) << n << ": bytes differ";
    }
    json a = read_json(kComposite / "config.json"), b = read_json(d / "config.json");
    EXPECT_EQ(a, b) << "config.json changed";
    EXPECT_EQ(shard < (int64_t(1) << 20), fs::exists(d / "model.safetensors.index.json"));
    // And it loads again as the same model.
    ModelWeights back = load_model(d);
    for (size_t u = 0; u < w.units.size(); ++u) EXPECT_EQ(w.units[u], back.units[u]) << "unit " << u;
    fs::remove_all(d);
  }
}

TEST(Qwen35Io, MisshapenOrMissingTextTensorIsAClearError) {
  ModelWeights w = load_model(kComposite);
  auto d = tmpdir("bad");
  SaveOptions so;
  so.passthrough_from = kComposite;
  save_model(d, w, so);
  // Rewrite the file without one deltanet tensor and with another misshapen.
  TensorStore st(d);
  std::vector<std::vector<float>> keep;
  std::vector<StWriteTensor> ts;
  const std::string gone = "model.language_model.layers.1.linear_attn.A_log";
  const std::string bad = "model.language_model.layers.0.linear_attn.conv1d.weight";
  for (auto& n : st.names()) {
    if (n == gone || n.rfind("model.visual.", 0) == 0 || n.rfind("mtp.", 0) == 0) continue;
    auto* r = st.find(n);
    keep.emplace_back(size_t(r->tensor->numel()));
    st.read_f32(n, keep.back().data());
    ts.push_back({n, r->tensor->shape, keep.back().data()});
  }
  fs::remove(d / "model.safetensors");
  write_safetensors(d / "model.safetensors", ts, DType::BF16);
  std::string msg;
  try {
    load_model(d);
  } catch (const lt::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(gone), std::string::npos) << msg;
  for (auto& t : ts)
    if (t.name == bad) t.shape = {t.shape[0], t.shape[2]};  // [C, K] instead of [C, 1, K]
  fs::path d2 = tmpdir("bad2");
  fs::copy_file(d / "config.json", d2 / "config.json");
  std::vector<float> a_log(4, 0.0f);
  ts.push_back({gone, {4}, a_log.data()});
  write_safetensors(d2 / "model.safetensors", ts, DType::BF16);
  msg.clear();
  try {
    load_model(d2);
  } catch (const lt::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(bad), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected shape"), std::string::npos) << msg;
  fs::remove_all(d);
  fs::remove_all(d2);
}
