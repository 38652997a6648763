#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/config.h"

using namespace lt::train;

static std::string err_of(const std::string& yaml, std::vector<std::string> ov = {}) {
  try {
    parse_config(yaml, "t.yaml", ov);
  } catch (const lt::Error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainConfig, ParsesKnownKeysAndTypes) {
  auto c = parse_config(
      "model_name_or_path: tiny\n"
      "dataset: builtin:math\n"
      "template: chatml\n"
      "per_device_train_batch_size: 16\n"
      "learning_rate: 3.0e-4\n"
      "lr_scheduler_type: cosine\n"
      "packing: true\n"
      "max_steps: 200\n"
      "gpu_mem: 24GiB\n",
      "t.yaml");
  EXPECT_EQ(c.model_name_or_path, "tiny");
  EXPECT_EQ(c.template_name, "chatml");
  EXPECT_EQ(c.per_device_train_batch_size, 16);
  EXPECT_DOUBLE_EQ(c.learning_rate, 3e-4);
  EXPECT_EQ(c.lr_scheduler_type, "cosine");
  EXPECT_TRUE(c.packing);
  EXPECT_EQ(c.max_steps, 200);
  EXPECT_EQ(c.gpu_mem, "24GiB");
}

TEST(TrainConfig, OverridesApplyAfterFile) {
  auto c = parse_config("model_name_or_path: tiny\nmax_steps: 5\n", "t.yaml",
                        {"max_steps=7", "learning_rate=1e-3", "resume_from_checkpoint=auto", "packing=false"});
  EXPECT_EQ(c.max_steps, 7);
  EXPECT_DOUBLE_EQ(c.learning_rate, 1e-3);
  EXPECT_EQ(c.resume_from_checkpoint, "auto");
  EXPECT_FALSE(c.packing);
}

TEST(TrainConfig, UnknownKeySuggestsNearest) {
  auto e = err_of("model_name_or_path: x\nlearning_rat: 1e-3\n");
  EXPECT_NE(e.find("unknown key 'learning_rat'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'learning_rate'"), std::string::npos) << e;
  e = err_of("model_name_or_path: x\n", {"per_devce_train_batch_size=4"});
  EXPECT_NE(e.find("did you mean 'per_device_train_batch_size'"), std::string::npos) << e;
  e = err_of("model_name_or_path: x\nzzzzzzzzzzzzz: 1\n");
  EXPECT_NE(e.find("valid keys:"), std::string::npos) << e;
}

TEST(TrainConfig, TypeErrorsNameKeyExpectedAndActual) {
  auto e = err_of("model_name_or_path: x\nper_device_train_batch_size: eight\n");
  EXPECT_NE(e.find("'per_device_train_batch_size' expects an integer, got 'eight'"), std::string::npos) << e;
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
  e = err_of("model_name_or_path: x\nlearning_rate: fast\n");
  EXPECT_NE(e.find("'learning_rate' expects a number, got 'fast'"), std::string::npos) << e;
  e = err_of("model_name_or_path: x\npacking: maybe\n");
  EXPECT_NE(e.find("'packing' expects a boolean"), std::string::npos) << e;
  e = err_of("model_name_or_path: x\nmax_steps: 2.5\n");
  EXPECT_NE(e.find("expects an integer"), std::string::npos) << e;
  e = err_of("model_name_or_path: x\ndataset: [a, b]\n");
  EXPECT_NE(e.find("'dataset' expects a string, got 'a list'"), std::string::npos) << e;
}

TEST(TrainConfig, ValidationErrors) {
  EXPECT_NE(err_of("dataset: x\n").find("model_name_or_path is required"), std::string::npos);
  EXPECT_NE(err_of("model_name_or_path: x\nlr_scheduler_type: step\n").find("expected one of: constant, linear, cosine"),
            std::string::npos);
  EXPECT_NE(err_of("model_name_or_path: x\noptimizer: sgd\n").find("adamw8bit"), std::string::npos);
  EXPECT_NE(err_of("model_name_or_path: x\ngpu_mem: lots\n").find("gpu_mem"), std::string::npos);
  EXPECT_NE(err_of("model_name_or_path: x\noptimizer_nvme: some\n").find("none, auto, all"), std::string::npos);
  EXPECT_NE(err_of("model_name_or_path: x\noptimizer_nvme: all\n").find("needs nvme_dir"), std::string::npos);
  EXPECT_EQ(err_of("model_name_or_path: x\noptimizer_nvme: all\nnvme_dir: /tmp\n"), "");
  EXPECT_NE(err_of("model_name_or_path: x\noptimizer_nvme: auto\n").find("needs nvme_dir"), std::string::npos);
  EXPECT_NE(err_of("model_name_or_path: x\ngradient_dtype: fp16\n").find("fp32, bf16, auto"), std::string::npos);
  EXPECT_NE(err_of("model_name_or_path: x\ngradients: host\ngradient_dtype: bf16\n").find("gradients: device"),
            std::string::npos);
  EXPECT_EQ(err_of("model_name_or_path: x\ngradients: device\ngradient_dtype: bf16\n"), "");
  EXPECT_NE(err_of("model_name_or_path: x\nper_device_train_batch_size: 0\n").find("must be > 0"), std::string::npos);
  EXPECT_NE(err_of("- a\n- b\n").find("expected a mapping"), std::string::npos);
  EXPECT_NE(err_of("model_name_or_path: [\n").find("invalid YAML"), std::string::npos);
}

// max_skipped_steps: 3 by default (the third non-finite step in a row stops training), an integer >= 0 (0 and 1: the
// first non-finite step stops training), and an error naming the key otherwise.
TEST(TrainConfig, MaxSkippedSteps) {
  EXPECT_EQ(parse_config("model_name_or_path: x\n", "t.yaml").max_skipped_steps, 3);
  EXPECT_EQ(parse_config("model_name_or_path: x\nmax_skipped_steps: 0\n", "t.yaml").max_skipped_steps, 0);
  EXPECT_EQ(parse_config("model_name_or_path: x\nmax_skipped_steps: 1\n", "t.yaml").max_skipped_steps, 1);
  EXPECT_EQ(parse_config("model_name_or_path: x\n", "t.yaml", {"max_skipped_steps=10"}).max_skipped_steps, 10);
  auto e = err_of("model_name_or_path: x\nmax_skipped_steps: -1\n");
  EXPECT_NE(e.find("max_skipped_steps must be an integer >= 0"), std::string::npos) << e;
  EXPECT_NE(e.find("got -1"), std::string::npos) << e;
  e = err_of("model_name_or_path: x\nmax_skipped_steps: few\n");
  EXPECT_NE(e.find("'max_skipped_steps' expects an integer, got 'few'"), std::string::npos) << e;
  e = err_of("model_name_or_path: x\n", {"max_skipped_steps=1.5"});
  EXPECT_NE(e.find("'max_skipped_steps' expects an integer"), std::string::npos) << e;
  auto d = parse_config(config_to_yaml(parse_config("model_name_or_path: x\nmax_skipped_steps: 5\n", "t.yaml")), "dump");
  EXPECT_EQ(d.max_skipped_steps, 5);
}

TEST(TrainConfig, YamlRoundTrip) {
  auto c = parse_config("model_name_or_path: tiny\nlearning_rate: 0.00025\nseed: 7\n", "t.yaml");
  auto d = parse_config(config_to_yaml(c), "dump");
  EXPECT_EQ(d.model_name_or_path, "tiny");
  EXPECT_DOUBLE_EQ(d.learning_rate, 0.00025);
  EXPECT_EQ(d.seed, 7);
}

TEST(TrainConfig, EditDistance) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(nearest_key("warmup_ration"), "warmup_ratio");
  EXPECT_EQ(nearest_key("optimiser"), "optimizer");
}

// A key written twice in the file is an error naming the key and both lines (the second would silently win), also
// inside model_overrides.
TEST(TrainConfig, DuplicateKeyIsAnErrorNamingBothLines) {
  auto e = err_of("model_name_or_path: x\nlearning_rate: 1e-3\nseed: 1\nlearning_rate: 2e-3\n");
  EXPECT_NE(e.find("t.yaml"), std::string::npos) << e;
  EXPECT_NE(e.find("'learning_rate'"), std::string::npos) << e;
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
  EXPECT_NE(e.find("line 4"), std::string::npos) << e;
  e = err_of("model_name_or_path: x\nmodel_overrides:\n  hidden_size: 64\n  hidden_size: 128\n");
  EXPECT_NE(e.find("'hidden_size'"), std::string::npos) << e;
  EXPECT_NE(e.find("line 3"), std::string::npos) << e;
  EXPECT_NE(e.find("line 4"), std::string::npos) << e;
}

// A key that is a list or a mapping is an lt::Error naming the file and line, not yaml-cpp's conversion error.
TEST(TrainConfig, NonScalarKeyIsAClearError) {
  for (const char* yaml : {"model_name_or_path: x\n[a, b]: 1\n", "model_name_or_path: x\n{a: 1}: 2\n",
                           "model_name_or_path: x\nmodel_overrides:\n  [a]: 1\n"}) {
    std::string e;
    try {
      parse_config(yaml, "t.yaml");
    } catch (const lt::Error& x) {
      e = x.what();
    } catch (const std::exception& x) {
      ADD_FAILURE() << "not an lt::Error: " << x.what();
    }
    EXPECT_NE(e.find("t.yaml"), std::string::npos) << yaml << ": " << e;
    EXPECT_NE(e.find("line"), std::string::npos) << yaml << ": " << e;
    EXPECT_NE(e.find("key"), std::string::npos) << yaml << ": " << e;
  }
}

// threads: 0 = all cores, a count > 0, and a negative number is an error.
TEST(TrainConfig, ThreadsMustBeNonNegative) {
  EXPECT_EQ(parse_config("model_name_or_path: x\nthreads: 0\n", "t.yaml").threads, 0);
  EXPECT_EQ(parse_config("model_name_or_path: x\nthreads: 4\n", "t.yaml").threads, 4);
  auto e = err_of("model_name_or_path: x\n", {"threads=-3"});
  EXPECT_NE(e.find("threads must be >= 0"), std::string::npos) << e;
  EXPECT_NE(e.find("got -3"), std::string::npos) << e;
}

// Every float key rejects .inf / -.inf / .nan with the value as written (not a NaN computed from it later).
TEST(TrainConfig, NonFiniteFloatsAreRejectedAsGiven) {
  for (const char* key : {"learning_rate", "warmup_ratio", "min_lr_ratio", "weight_decay", "adam_beta1", "adam_beta2",
                          "adam_epsilon", "max_grad_norm", "num_train_epochs", "val_size", "peak_tflops"}) {
    for (const char* v : {".inf", "-.inf", ".nan"}) {
      auto e = err_of("model_name_or_path: x\n", {std::string(key) + "=" + v});
      EXPECT_NE(e.find(std::string("'") + key + "'"), std::string::npos) << key << "=" << v << ": " << e;
      EXPECT_NE(e.find("finite"), std::string::npos) << key << "=" << v << ": " << e;
      EXPECT_NE(e.find(std::string("got '") + v + "'"), std::string::npos) << key << "=" << v << ": " << e;
    }
  }
  auto e = err_of("model_name_or_path: x\nlearning_rate: .inf\n");
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
  EXPECT_EQ(e.find("nan"), std::string::npos) << e;
  // A config built in code is checked too, its value printed as inf / nan.
  TrainConfig c = parse_config("model_name_or_path: x\n", "t.yaml");
  c.learning_rate = std::numeric_limits<double>::infinity();
  try {
    validate_config(c);
    ADD_FAILURE() << "learning_rate inf accepted";
  } catch (const lt::Error& x) {
    EXPECT_NE(std::string(x.what()).find("learning_rate must be a finite number, got inf"), std::string::npos)
        << x.what();
  }
}

// The effective config written next to checkpoints (trainer_config.yaml) parses back, model_overrides included
// (a resume compares it with the run's config).
TEST(TrainConfig, ModelOverridesRoundTripThroughTheDump) {
  auto c = parse_config(
      "model_name_or_path: tiny\nmodel_overrides:\n  hidden_size: 64\n  rms_norm_eps: 1.0e-5\n  tie_word_embeddings: "
      "false\n  layer_types: [full_attention, linear_attention]\n  name: \"x y\"\n",
      "t.yaml");
  auto d = parse_config(config_to_yaml(c), "dump");
  EXPECT_EQ(nlohmann::json::parse(d.model_overrides), nlohmann::json::parse(c.model_overrides)) << config_to_yaml(c);
  EXPECT_EQ(nlohmann::json::parse(d.model_overrides).at("hidden_size"), 64);
}
