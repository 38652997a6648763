// Checkpoint contents (written atomically through checkpoint_dir.h):
//   checkpoint-<step>/
//     config.json, generation_config.json, model*.safetensors   HF model dir (save_dtype: bf16 or fp32)
//     tokenizer.json, tokenizer_config.json, chat_template.jinja, ...  copied from the tokenizer directory
//     trainer_config.yaml                                        effective config of the run
//     trainer_state/trainer_state.json                           step, data position, schedule, RNG, ...
//     trainer_state/master/                                      fp32 master weights (HF dir, F32)
//     trainer_state/optimizer.bin                                AdamW moments (fp32 or 8-bit codes+scales), t
//     COMPLETE                                                   written last
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/host_state.h"
#include "io/model_io.h"
#include "model/model_config.h"
#include "model/param_layout.h"
#include "optim/optimizer.h"

namespace lt::train {

namespace fs = std::filesystem;

// What the trainer needs to continue exactly where it stopped.
struct TrainerState {
  int64_t global_step = 0;            // optimizer steps done
  int64_t micro_batches_done = 0;     // micro-batches consumed since the start
  int64_t data_epoch = 0, data_index = 0;  // data loader position (data::DataPosition): next sample
  int64_t batches_per_epoch = 0;      // micro-batches per epoch of the run (checked on resume)
  int64_t total_steps = 0;
  uint64_t seed = 0;
  std::string lr_scheduler_type;
  double base_lr = 0;
  int64_t warmup_steps = 0;
  double last_lr = 0;
  std::vector<double> losses;         // loss of every step so far (resume tests, plots; NaN: JSON null)
  int64_t skipped_steps = 0;          // steps whose update was skipped for a non-finite gradient norm
  int64_t nonfinite_loss_steps = 0;   // steps with a non-finite loss but a finite norm (update applied)
  std::string optimizer;              // adamw | adamw8bit | hybrid
  std::string master_weights = "fp32";  // fp32 | bf16-sr (absent in older checkpoints: fp32)
  std::vector<std::string> tensors_8bit;
  std::string model_name;
};
nlohmann::json trainer_state_to_json(const TrainerState& s);
TrainerState trainer_state_from_json(const nlohmann::json& j, const std::string& source);

struct CheckpointContents {
  const ModelConfig* model = nullptr;
  const ModelLayout* layout = nullptr;
  UnitReader masters;                 // the fp32 master of every unit, read in pieces
  optim::CpuAdamW* optimizer = nullptr;  // its in-flight updates must be finished
  // Writes trainer_state/optimizer.bin instead of optimizer->save (data parallel: the merged shards).
  std::function<void(const fs::path& file)> write_optimizer;
  TrainerState state;
  std::string config_yaml;
  // The tokenizer the run uses (a directory, or a tokenizer.json): its files (tokenizer.json,
  // tokenizer_config.json, chat_template.jinja, special_tokens_map.json, added_tokens.json, vocab/merges,
  // generation_config.json, additional_chat_templates/, ...) are copied into the checkpoint.
  fs::path tokenizer_dir;
  bool save_fp32_model = false;       // model dir weights in fp32 (else bf16)
  fs::path passthrough_from;          // model dir whose untrained tensors are copied (SaveOptions)
};

// Writes output_dir/checkpoint-<step> atomically, then rotates to save_total_limit. Returns its path.
fs::path save_checkpoint(const fs::path& output_dir, const CheckpointContents& c, int64_t save_total_limit);

// Reads trainer_state/trainer_state.json of a checkpoint.
TrainerState read_trainer_state(const fs::path& ckpt);
// Loads the fp32 masters (into `masters`, in pieces of at most piece(u) elements) and the optimizer state.
void load_checkpoint_weights(const fs::path& ckpt, const ModelConfig& c, const ModelLayout& layout,
                             const UnitSink& masters, const PieceSize& piece, optim::CpuAdamW* optimizer);

}  // namespace lt::train
