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
  EXPECT_EQ(c.model.name_or_path, "tiny");
  EXPECT_EQ(c.data.template_name, "chatml");
  EXPECT_EQ(c.schedule.per_device_train_batch_size, 16);
  EXPECT_DOUBLE_EQ(c.schedule.learning_rate, 3e-4);
  EXPECT_EQ(c.schedule.lr_scheduler_type, LrSchedulerType::Cosine);
  EXPECT_TRUE(c.data.packing);
  EXPECT_EQ(c.schedule.max_steps, 200);
  EXPECT_EQ(c.placement.gpu_mem, "24GiB");
}

TEST(TrainConfig, OverridesApplyAfterFile) {
  auto c = parse_config("model_name_or_path: tiny\nmax_steps: 5\n", "t.yaml",
                        {"max_steps=7", "learning_rate=1e-3", "resume_from_checkpoint=auto", "packing=false"});
  EXPECT_EQ(c.schedule.max_steps, 7);
  EXPECT_DOUBLE_EQ(c.schedule.learning_rate, 1e-3);
  EXPECT_EQ(c.output.resume_from_checkpoint, "auto");
  EXPECT_FALSE(c.data.packing);
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
  EXPECT_EQ(err_of("model_name_or_path: x\ngradients: host\ngradient_dtype: bf16\n"), "");  // host bf16 gradients
  EXPECT_EQ(err_of("model_name_or_path: x\ngradients: device\ngradient_dtype: bf16\n"), "");
  EXPECT_NE(err_of("model_name_or_path: x\nper_device_train_batch_size: 0\n").find("must be > 0"), std::string::npos);
  EXPECT_NE(err_of("- a\n- b\n").find("expected a mapping"), std::string::npos);
  EXPECT_NE(err_of("model_name_or_path: [\n").find("invalid YAML"), std::string::npos);
}

// max_skipped_steps: 3 by default (the third non-finite step in a row stops training), an integer >= 0 (0 and 1: the
// first non-finite step stops training), and an error naming the key otherwise.
TEST(TrainConfig, MaxSkippedSteps) {
  EXPECT_EQ(parse_config("model_name_or_path: x\n", "t.yaml").schedule.max_skipped_steps, 3);
  EXPECT_EQ(parse_config("model_name_or_path: x\nmax_skipped_steps: 0\n", "t.yaml").schedule.max_skipped_steps, 0);
  EXPECT_EQ(parse_config("model_name_or_path: x\nmax_skipped_steps: 1\n", "t.yaml").schedule.max_skipped_steps, 1);
  EXPECT_EQ(parse_config("model_name_or_path: x\n", "t.yaml", {"max_skipped_steps=10"}).schedule.max_skipped_steps, 10);
  auto e = err_of("model_name_or_path: x\nmax_skipped_steps: -1\n");
  EXPECT_NE(e.find("max_skipped_steps must be an integer >= 0"), std::string::npos) << e;
  EXPECT_NE(e.find("got -1"), std::string::npos) << e;
  e = err_of("model_name_or_path: x\nmax_skipped_steps: few\n");
  EXPECT_NE(e.find("'max_skipped_steps' expects an integer, got 'few'"), std::string::npos) << e;
  e = err_of("model_name_or_path: x\n", {"max_skipped_steps=1.5"});
  EXPECT_NE(e.find("'max_skipped_steps' expects an integer"), std::string::npos) << e;
  auto d = parse_config(config_to_yaml(parse_config("model_name_or_path: x\nmax_skipped_steps: 5\n", "t.yaml")), "dump");
  EXPECT_EQ(d.schedule.max_skipped_steps, 5);
}

TEST(TrainConfig, YamlRoundTrip) {
  auto c = parse_config("model_name_or_path: tiny\nlearning_rate: 0.00025\nseed: 7\n", "t.yaml");
  auto d = parse_config(config_to_yaml(c), "dump");
  EXPECT_EQ(d.model.name_or_path, "tiny");
  EXPECT_DOUBLE_EQ(d.schedule.learning_rate, 0.00025);
  EXPECT_EQ(d.schedule.seed, 7);
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
  EXPECT_EQ(parse_config("model_name_or_path: x\nthreads: 0\n", "t.yaml").placement.threads, 0);
  EXPECT_EQ(parse_config("model_name_or_path: x\nthreads: 4\n", "t.yaml").placement.threads, 4);
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
  c.schedule.learning_rate = std::numeric_limits<double>::infinity();
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
  EXPECT_EQ(nlohmann::json::parse(d.model.overrides), nlohmann::json::parse(c.model.overrides)) << config_to_yaml(c);
  EXPECT_EQ(nlohmann::json::parse(d.model.overrides).at("hidden_size"), 64);
}

// Every key with a fixed set of values is parsed once into its enum: a value outside the set is an error naming the
// file and line (or the command line), the key, the value and every value the key accepts.
TEST(TrainConfig, EnumKeysNameTheFieldAndTheAllowedValues) {
  const std::vector<std::pair<std::string, std::string>> keys = {
      {"on_malformed", "skip, fatal"},
      {"overlong", "truncate, skip"},
      {"lr_scheduler_type", "constant, linear, cosine"},
      {"optimizer", "adamw, adamw8bit, hybrid"},
      {"master_weights", "fp32, bf16-sr, auto"},
      {"gradients", "host, device, auto"},
      {"gradient_dtype", "fp32, bf16, auto"},
      {"embedding_update", "host, device, auto"},
      {"optimizer_nvme", "none, auto, all"},
      {"backend", "auto, cpu, cuda"},
      {"save_dtype", "bf16, fp32"},
  };
  for (const auto& [key, allowed] : keys) {
    auto e = err_of("model_name_or_path: x\n" + key + ": bogus\n");
    EXPECT_NE(e.find("t.yaml (line 2): " + key + " = 'bogus' is not valid; expected one of: " + allowed),
              std::string::npos)
        << e;
    e = err_of("model_name_or_path: x\n", {key + "=Bogus"});
    EXPECT_NE(e.find("command line override: " + key + " = 'Bogus' is not valid; expected one of: " + allowed),
              std::string::npos)
        << e;
    e = err_of("model_name_or_path: x\n" + key + ": [a]\n");
    EXPECT_NE(e.find("'" + key + "' expects a string, got 'a list'"), std::string::npos) << e;
    e = err_of("model_name_or_path: x\n" + key + ":\n");
    EXPECT_NE(e.find(key + " = '' is not valid"), std::string::npos) << e;
  }
}

// The names map to the enums, the defaults are those documented, and the dump writes the names back.
TEST(TrainConfig, EnumKeysParseAndRoundTrip) {
  const TrainConfig def = parse_config("model_name_or_path: x\n", "t.yaml");
  EXPECT_EQ(def.data.on_malformed, OnMalformed::Skip);
  EXPECT_EQ(def.data.overlong, OverlongPolicy::Truncate);
  EXPECT_EQ(def.schedule.lr_scheduler_type, LrSchedulerType::Linear);
  EXPECT_EQ(def.optimizer.type, OptimizerType::AdamW);
  EXPECT_EQ(def.placement.master_weights, MasterWeights::Fp32);
  EXPECT_EQ(def.placement.gradients, GradientHome::Auto);
  EXPECT_EQ(def.placement.gradient_dtype, GradientDtype::Auto);
  EXPECT_EQ(def.placement.embedding_update, EmbeddingUpdate::Auto);
  EXPECT_EQ(def.placement.optimizer_nvme, OptimizerNvme::None);
  EXPECT_EQ(def.placement.backend, BackendKind::Auto);
  EXPECT_EQ(def.output.save_dtype, SaveDtype::Bf16);
  EXPECT_FALSE(def.placement.device_update_layers.has_value());

  const TrainConfig c = parse_config(
      "model_name_or_path: x\non_malformed: fatal\noverlong: skip\nlr_scheduler_type: constant\n"
      "optimizer: adamw8bit\nmaster_weights: bf16-sr\ngradients: device\ngradient_dtype: bf16\n"
      "embedding_update: host\noptimizer_nvme: all\nnvme_dir: /tmp\nbackend: cpu\nsave_dtype: fp32\n"
      "device_update_layers: 3\n",
      "t.yaml");
  for (const TrainConfig& d : {c, parse_config(config_to_yaml(c), "dump")}) {
    EXPECT_EQ(d.data.on_malformed, OnMalformed::Fatal);
    EXPECT_EQ(d.data.overlong, OverlongPolicy::Skip);
    EXPECT_EQ(d.schedule.lr_scheduler_type, LrSchedulerType::Constant);
    EXPECT_EQ(d.optimizer.type, OptimizerType::AdamW8bit);
    EXPECT_EQ(d.placement.master_weights, MasterWeights::Bf16Sr);
    EXPECT_EQ(d.placement.gradients, GradientHome::Device);
    EXPECT_EQ(d.placement.gradient_dtype, GradientDtype::Bf16);
    EXPECT_EQ(d.placement.embedding_update, EmbeddingUpdate::Host);
    EXPECT_EQ(d.placement.optimizer_nvme, OptimizerNvme::All);
    EXPECT_EQ(d.placement.backend, BackendKind::Cpu);
    EXPECT_EQ(d.output.save_dtype, SaveDtype::Fp32);
    EXPECT_EQ(d.placement.device_update_layers, std::optional<int64_t>(3));
  }
  const std::string dump = config_to_yaml(c);
  EXPECT_NE(dump.find("master_weights: \"bf16-sr\""), std::string::npos) << dump;
  EXPECT_NE(dump.find("device_update_layers: \"3\""), std::string::npos) << dump;
  EXPECT_NE(config_to_yaml(def).find("device_update_layers: \"auto\""), std::string::npos);
  EXPECT_STREQ(name_of(MasterWeights::Bf16Sr), "bf16-sr");
  EXPECT_EQ(choice_names<OptimizerNvme>(), (std::vector<std::string>{"none", "auto", "all"}));
}

// The value is parsed once the file and the command line are read: an override corrects a bad value in the file.
TEST(TrainConfig, AnOverrideCorrectsAnEnumValueOfTheFile) {
  const TrainConfig c = parse_config("model_name_or_path: x\noptimizer: sgd\ndevice_update_layers: many\n", "t.yaml",
                                     {"optimizer=hybrid", "device_update_layers=auto"});
  EXPECT_EQ(c.optimizer.type, OptimizerType::Hybrid);
  EXPECT_FALSE(c.placement.device_update_layers.has_value());
}

// gradient_ring_depth: auto or a count of layers >= 1 (default 8).
TEST(TrainConfig, GradientRingDepthIsAutoOrACountOfLayers) {
  EXPECT_EQ(parse_config("model_name_or_path: x\n", "t.yaml").placement.gradient_ring_depth,
            std::optional<int64_t>(lt::kGradRingDepth));
  EXPECT_EQ(parse_config("model_name_or_path: x\ngradient_ring_depth: 3\n", "t.yaml").placement.gradient_ring_depth,
            std::optional<int64_t>(3));
  EXPECT_FALSE(parse_config("model_name_or_path: x\ngradient_ring_depth: auto\n", "t.yaml").placement.gradient_ring_depth);
  for (const char* bad : {"0", "-1", "deep"}) {
    const std::string e = err_of(std::string("model_name_or_path: x\ngradient_ring_depth: ") + bad + "\n");
    EXPECT_NE(e.find("t.yaml (line 2): gradient_ring_depth must be auto or a count of layers >= 1, got '" +
                     std::string(bad) + "'"),
              std::string::npos)
        << e;
  }
}

// head_gradient: full | slices | auto (the default); anything else names the key and the names it takes.
TEST(TrainConfig, HeadGradientIsFullSlicesOrAuto) {
  EXPECT_EQ(parse_config("model_name_or_path: x\n", "t.yaml").placement.head_gradient, HeadGradient::Auto);
  EXPECT_EQ(parse_config("model_name_or_path: x\nhead_gradient: slices\n", "t.yaml").placement.head_gradient,
            HeadGradient::Slices);
  EXPECT_EQ(parse_config("model_name_or_path: x\n", "t.yaml", {"head_gradient=full"}).placement.head_gradient,
            HeadGradient::Full);
  const std::string e = err_of("model_name_or_path: x\nhead_gradient: sliced\n");
  EXPECT_NE(e.find("head_gradient"), std::string::npos) << e;
  EXPECT_NE(e.find("full, slices, auto"), std::string::npos) << e;
}

// device_update_layers: "auto" or a count >= 0; anything else names the key, where it was set and the value.
TEST(TrainConfig, DeviceUpdateLayersIsAutoOrACount) {
  EXPECT_EQ(parse_config("model_name_or_path: x\ndevice_update_layers: 0\n", "t.yaml").placement.device_update_layers,
            std::optional<int64_t>(0));
  for (const char* bad : {"-1", "two", "1.5"}) {
    auto e = err_of(std::string("model_name_or_path: x\ndevice_update_layers: ") + bad + "\n");
    EXPECT_NE(e.find("t.yaml (line 2): device_update_layers must be auto or a count of layers >= 0, got '" +
                     std::string(bad) + "'"),
              std::string::npos)
        << e;
  }
  TrainConfig c = parse_config("model_name_or_path: x\n", "t.yaml");
  c.placement.device_update_layers = -2;  // built in code
  try {
    validate_config(c);
    ADD_FAILURE() << "device_update_layers -2 accepted";
  } catch (const lt::Error& x) {
    EXPECT_NE(std::string(x.what()).find("device_update_layers must be auto or a count"), std::string::npos)
        << x.what();
  }
}
