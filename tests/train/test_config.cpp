#include <gtest/gtest.h>

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
