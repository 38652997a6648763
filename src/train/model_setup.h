// The model a run starts from: its config (a model directory, a preset, plus model_overrides), its
// tokenizer, and the initial fp32 weights (loaded from safetensors, or seeded random init when the
// model has no weights; a resumed run takes both from the checkpoint).
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "data/chat_template.h"
#include "model/model_config.h"
#include "model/param_layout.h"
#include "train/config.h"

namespace lt::train {

// Where the starting weights come from. They are written into the host state unit by unit
// (write_initial_weights, trainer_setup.h): a whole fp32 copy of a 14B model beside its host state
// would not fit the host.
struct InitialWeights {
  enum class Source { Checkpoint, Pretrained, Random };
  Source source = Source::Random;
  std::filesystem::path dir;  // Pretrained: the model directory
  uint64_t seed = 0;          // Random
};

struct ModelSetup {
  data::LoadedTokenizer tokenizer;
  std::filesystem::path tokenizer_dir;  // copied into checkpoints
  ModelConfig model;
  ModelLayout layout;
  InitialWeights initial;               // Checkpoint when resuming (the checkpoint provides them)
  bool pretrained = false;              // weights came from safetensors
  // The directory the weights came from (model dir or resumed checkpoint): checkpoints copy its
  // pass-through tensors (Qwen3.5's vision tower and MTP layers) unchanged. Empty for random init.
  std::filesystem::path weights_source;
};

// Where the tokenizer is: `tokenizer` if set, else the checkpoint being resumed, else the model
// directory. Throws lt::Error saying what to set when none has a tokenizer.json.
std::filesystem::path find_tokenizer(const ModelSection& cfg, const std::optional<std::filesystem::path>& resume);
// model_name_or_path (+ model_overrides, a JSON object of config.json fields). An overridden field that the
// config.json parser does not read for the model's architecture (a typo, or a field without effect) is an
// error, with the nearest field it reads.
ModelConfig configured_model(const ModelSection& cfg);
// The parameter count of model_layout(c) (tied embedding counted once), computed in long double so that it
// cannot overflow for any config.
long double model_parameter_count(const ModelConfig& c);
// Throws lt::Error "does not fit: host memory short by ..." when the model cannot fit this host whatever
// the plan: its parameters need at least 2 bytes each in host memory (bf16 masters), against host_mem or
// else MemAvailable; and when its byte counts would not fit 64-bit integers. Runs before anything is sized
// from the model (profile, plan, host state).
void check_model_fits_host(const ModelConfig& c, const PlacementSection& cfg);
bool has_weights(const std::filesystem::path& dir);

// Resuming from `ckpt`: the keys a resume cannot change (model_overrides: the checkpoint holds the model; seed:
// the data order and the rounding stream continue its own) must equal the checkpoint's (its
// trainer_config.yaml and trainer_state.json), else lt::Error naming each key, both values and why; a different
// model_name_or_path is ignored with a warning saying so.
void check_resume_keys(const TrainConfig& cfg, const std::filesystem::path& ckpt);

ModelSetup setup_model(const TrainConfig& cfg, const std::optional<std::filesystem::path>& resume);

}  // namespace lt::train
