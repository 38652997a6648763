// The model a run starts from (train/model_setup.h): model_overrides are checked field by field against
// what lazytrain reads from config.json, and the model's size is checked before anything is allocated.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "../common/repo_path.h"
#include "core/error.h"
#include "model/param_layout.h"
#include "train/config.h"
#include "train/model_setup.h"
#include "train/trainer.h"

using namespace lt;
using namespace lt::train;

namespace {

TrainConfig with_overrides(const std::string& model, const std::string& overrides_yaml) {
  return parse_config("model_name_or_path: " + model + "\nmodel_overrides: " + overrides_yaml + "\n", "t.yaml");
}

std::string configured_model_error(const std::string& model, const std::string& overrides_yaml) {
  try {
    configured_model(with_overrides(model, overrides_yaml).model);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// A misspelt config.json field in model_overrides is an error with the nearest field lazytrain reads, not an
// override silently dropped.
TEST(ModelOverrides, UnknownFieldIsAnErrorWithDidYouMean) {
  auto e = configured_model_error("tiny-qwen2", "{hidden_sise: 128}");
  EXPECT_NE(e.find("model_overrides"), std::string::npos) << e;
  EXPECT_NE(e.find("'hidden_sise'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'hidden_size'"), std::string::npos) << e;
  e = configured_model_error("tiny-llama3", "{num_hiden_layers: 3}");
  EXPECT_NE(e.find("did you mean 'num_hidden_layers'"), std::string::npos) << e;
  e = configured_model_error("tiny-qwen35", "{linear_num_key_head: 4}");
  EXPECT_NE(e.find("did you mean 'linear_num_key_heads'"), std::string::npos) << e;
  // A field with no near name: the message lists what lazytrain reads.
  e = configured_model_error("tiny-qwen2", "{zzzzzzzzzzzz: 1}");
  EXPECT_NE(e.find("'zzzzzzzzzzzz'"), std::string::npos) << e;
  EXPECT_NE(e.find("intermediate_size"), std::string::npos) << e;
  // A real HF field that lazytrain does not read for this architecture has no effect: an error too.
  e = configured_model_error("tiny-qwen2", "{use_cache: false}");
  EXPECT_NE(e.find("'use_cache'"), std::string::npos) << e;
  EXPECT_NE(e.find("no effect"), std::string::npos) << e;
}

// Fields lazytrain reads are accepted and applied, for every family.
TEST(ModelOverrides, KnownFieldsApply) {
  EXPECT_EQ(configured_model(with_overrides("tiny-qwen2", "{hidden_size: 128, num_hidden_layers: 3}").model).hidden, 128);
  EXPECT_EQ(configured_model(with_overrides("tiny-qwen3", "{head_dim: 16, rms_norm_eps: 1.0e-5}").model).head_dim, 16);
  EXPECT_EQ(configured_model(with_overrides("tiny-llama3", "{max_position_embeddings: 512}").model).max_position, 512);
  EXPECT_EQ(configured_model(with_overrides("tiny-qwen35", "{full_attention_interval: 2, num_hidden_layers: 4}").model)
                .count(LayerKind::Attention),
            2);
  EXPECT_EQ(configured_model(with_overrides("tiny-qwen2", "{tie_word_embeddings: false}").model).tied, false);
}

// The shipped configs' model_overrides name only fields lazytrain reads.
TEST(ModelOverrides, ShippedConfigsAreAccepted) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(lt::testing::repo_root() / "configs")) {
    if (e.path().extension() != ".yaml") continue;
    const TrainConfig c = load_config(e.path());
    if (c.model.overrides.empty()) continue;
    EXPECT_NO_THROW(configured_model(c.model)) << e.path();
    ++n;
  }
  EXPECT_GE(n, 2);
}

namespace {

TrainConfig sized_run(const std::string& overrides_yaml, const std::string& extra = "") {
  return parse_config(fmt::format("model_name_or_path: tiny-qwen2\nmodel_overrides: {}\ntokenizer: {}/configs/demo\n"
                                  "dataset: builtin:math\nmax_samples: 16\ncutoff_len: 64\nmax_steps: 1\n"
                                  "per_device_train_batch_size: 2\nprogress_bar: false\nthreads: 1\n"
                                  "output_dir: {}\n{}",
                                  overrides_yaml, lt::testing::repo_root().string(),
                                  (std::filesystem::temp_directory_path() /
                                   ("lt_model_setup_" + std::to_string(::getpid())))
                                      .string(),
                                  extra),
                      "t.yaml");
}

}  // namespace

// A hidden size whose parameter count overflows 64-bit byte counts (4e9: hidden^2 alone is 1.6e19) is reported as
// not fitting the host before anything is sized from it (it was std::bad_alloc in the planner's profile).
TEST(ModelSize, HugeHiddenSizeDoesNotFitBeforeAllocating) {
  for (const char* ov : {"{hidden_size: 4000000000}", "{hidden_size: 10000000000}", "{vocab_size: 4000000000000}",
                         "{num_hidden_layers: 100000000000}"}) {
    std::string e;
    try {
      setup_model(sized_run(ov), std::nullopt);
    } catch (const Error& x) {
      e = x.what();
    } catch (const std::exception& x) {
      ADD_FAILURE() << ov << ": not an lt::Error: " << x.what();
    }
    EXPECT_NE(e.find("does not fit"), std::string::npos) << ov << ": " << e;
    EXPECT_NE(e.find("host memory short by"), std::string::npos) << ov << ": " << e;
    EXPECT_NE(e.find("parameters"), std::string::npos) << ov << ": " << e;
  }
  // The whole run stops with the same lt::Error (no std::bad_alloc from the planner's profile).
  try {
    TrainHooks h;
    h.install_signal_handlers = false;
    run_training(sized_run("{hidden_size: 4000000000}"), h);
    ADD_FAILURE() << "trained a model of hidden size 4e9";
  } catch (const Error& x) {
    EXPECT_NE(std::string(x.what()).find("does not fit"), std::string::npos) << x.what();
  } catch (const std::exception& x) {
    ADD_FAILURE() << "not an lt::Error: " << x.what();
  }
  std::filesystem::remove_all(std::filesystem::temp_directory_path() / ("lt_model_setup_" + std::to_string(::getpid())));
}

// host_mem below the smallest host state of the model (2 bytes per parameter): the message says by how much.
TEST(ModelSize, HostMemBelowTheSmallestStateSaysByHowMuch) {
  std::string e;
  try {
    setup_model(sized_run("{hidden_size: 4096, intermediate_size: 8192, num_hidden_layers: 8}", "host_mem: 64MiB\n"),
                std::nullopt);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("does not fit: host memory short by"), std::string::npos) << e;
  EXPECT_NE(e.find("host_mem"), std::string::npos) << e;
  EXPECT_NE(e.find("64.0 MiB"), std::string::npos) << e;
}

// The overflow-safe count used by the check equals the layout's for every preset.
TEST(ModelSize, CheckedParameterCountMatchesTheLayout) {
  for (const auto& name : preset_names()) {
    const ModelConfig c = preset_config(name);
    EXPECT_EQ(double(model_parameter_count(c)), double(model_layout(c).parameter_count())) << name;
  }
}
