// TrainConfig: everything `lazytrain train config.yaml [key=value ...]` accepts.
// Names follow HF TrainingArguments / LLaMA-Factory where they exist, plus lazytrain's own
// (gpu_mem, host_mem, nvme_dir, nvme_mem, planner, optimizer, backend).
// Unknown keys are errors that suggest the nearest valid key (edit distance); type errors name
// the key, the expected type and the value found.
//
// The file is one flat mapping of keys (unchanged for users); parse_config reads it once into typed sections.
// Each member keeps its key's name, except model_name_or_path -> model.name_or_path, model_overrides ->
// model.overrides, template -> data.template_name and optimizer -> optimizer.type. Keys with a fixed set of
// values are enums (config_choices.h); device_update_layers is "auto" (nullopt) or a count.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/model_state.h"
#include "train/config_choices.h"

namespace lt::train {

struct ModelSection {
  std::string name_or_path;            // model_name_or_path: model dir (config.json [+ safetensors]) or a preset name
  std::string overrides;               // model_overrides: JSON object of HF config.json fields applied on top (YAML
                                       // mapping in the file), e.g. {hidden_size: 192, num_hidden_layers: 3}
  std::string tokenizer;               // tokenizer dir/file; default: model dir, else configs/demo
};

struct DataSection {
  std::string dataset;                 // JSONL path or builtin:math
  std::string eval_dataset;            // optional JSONL for periodic eval-loss; default: val split
  std::string template_name = "auto";  // chat template ("template" in YAML)
  int64_t cutoff_len = 1024;
  bool packing = false;
  bool train_on_inputs = false;
  double val_size = 0.0;               // fraction (<1) or count (>=1) of samples held out
  int64_t max_samples = 0;             // 0 = all; for builtin datasets: how many to generate
  // auto | query_response | alpaca | messages | text, and their aliases: the data module's names
  // (data::parse_record_format), checked when the data is read.
  std::string dataset_format = "auto";
  OnMalformed on_malformed = OnMalformed::Skip;
  OverlongPolicy overlong = OverlongPolicy::Truncate;  // samples longer than cutoff_len
};

// Batch, steps and LR schedule.
struct ScheduleSection {
  int64_t per_device_train_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  double learning_rate = 5e-5;
  LrSchedulerType lr_scheduler_type = LrSchedulerType::Linear;
  double warmup_ratio = 0.0;
  int64_t warmup_steps = 0;                  // takes precedence over warmup_ratio when > 0
  double min_lr_ratio = 0.0;                 // floor of cosine/linear decay, as a fraction of lr
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;                    // > 0 overrides num_train_epochs
  int64_t max_skipped_steps = 3;             // the step that makes this many non-finite steps in a row (gradient
                                             // norm: update skipped; or loss) stops training with an error (0: the first)
  int64_t seed = 42;                         // data order, random init, bf16-sr rounding
};

struct OptimizerSection {
  OptimizerType type = OptimizerType::AdamW;  // "optimizer" in YAML
  double weight_decay = 0.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;                // <= 0 disables clipping
};

// Memory budgets, tiers, the planner and where each part of the model state and its update lives.
struct PlacementSection {
  std::string gpu_mem;                       // byte string ("24GiB"); empty = what the device has
  std::string host_mem;                      // DRAM budget of the host (under launch: shared by its ranks);
                                             // empty = MemAvailable
  std::string nvme_dir;
  std::string nvme_mem;
  std::string planner = "milp";              // kPlannerNames (plan/heuristics.h): milp | dp | megatrain:K | all-gpu |
                                             // sqrt | cpu-all
  std::string profile;                       // resource profile JSON or preset; empty = measure/estimate
  MasterWeights master_weights = MasterWeights::Fp32;  // fp32 (exact; 4 B/param with its bf16 copy) | bf16-sr | auto
  GradientHome gradients = GradientHome::Auto;         // where the step's gradient waits for the norm
  GradientDtype gradient_dtype = GradientDtype::Auto;  // of gradients held on the device (auto: bf16 if fp32 does not fit)
  OptimizerNvme optimizer_nvme = OptimizerNvme::None;  // optimizer moments on NVMe (nvme_dir): auto = the planner's,
                                                       // all = every layer's
  bool keep_internals = true;        // let the planner keep the last layers' forward internals in HBM (Plan::kept_layers)
  bool embedding_rows_first = true;  // untied table looked up on the host: the next step's rows of its update first
  // Gradients held on the device: their pinned staging ring's depth in median layers (fewer: less DRAM, the optimizer
  // at most that many layers ahead of the next forward); nullopt = "auto" (the depth the planner simulates fastest).
  std::optional<int64_t> gradient_ring_depth = kGradRingDepth;
  // Gradients held on the device in bf16, untied head: its weight gradient by vocabulary slices (no [vocab, hidden]
  // fp32 buffers, one more logits GEMM; StatePlacement::head_grad_slices), full, or auto (the faster plan).
  HeadGradient head_gradient = HeadGradient::Auto;
  // The first k decoder layers' AdamW steps on the GPU (their weights, gradients and optimizer state in HBM):
  // nullopt = "auto" (the k the planner simulates fastest, on a GPU where it can; 0 on the CPU backend), or a count.
  std::optional<int64_t> device_update_layers;
  EmbeddingUpdate embedding_update = EmbeddingUpdate::Auto;  // the tied embedding's AdamW step (device: on the GPU;
                                                             // auto: device where it can, on a GPU)
  BackendKind backend = BackendKind::Auto;
  int64_t threads = 0;                       // CPU threads; 0 = all cores
};

// Periodic eval-loss, and the exact-match evaluation on a test set after training (eval command semantics).
struct EvalSection {
  int64_t eval_steps = 0;                    // 0 = no periodic eval
  int64_t per_device_eval_batch_size = 0;    // 0 = same as train
  std::string do_eval_dataset;               // JSONL or builtin:math-test; empty = none
  int64_t eval_max_samples = 0;              // 0 = all
  int64_t max_new_tokens = 64;
};

// The output directory: checkpoints, resume, logging and tracing.
struct OutputSection {
  std::string output_dir = "output";
  bool overwrite_output_dir = false;
  std::string resume_from_checkpoint;        // "", a checkpoint dir, or "auto"
  int64_t save_steps = 500;                  // 0 = only at the end
  int64_t save_total_limit = 0;              // 0 = keep all
  SaveDtype save_dtype = SaveDtype::Bf16;    // model weights in checkpoints
  bool save_final = true;                    // save a checkpoint at the last step
  int64_t logging_steps = 10;
  bool progress_bar = true;                  // only shown when stdout is a terminal
  double peak_tflops = 0;                    // MFU denominator; 0 = by device (989 on H100/H200 class)
  std::string trace;                         // Chrome/Perfetto trace of one step written here; empty = none
  int64_t trace_step = 2;                    // which step to trace (2: after the first step's warm-up)
};

struct TrainConfig {
  ModelSection model;
  DataSection data;
  ScheduleSection schedule;
  OptimizerSection optimizer;
  PlacementSection placement;
  EvalSection eval;
  OutputSection output;

  std::filesystem::path config_path;         // where it was read from (for messages)
  std::vector<std::string> overrides;        // the command line's key=value overrides (for messages)
};

// Every key a config may contain, in documentation order.
const std::vector<std::string>& config_keys();

// Parses YAML text. `source` names the file in messages. Then applies overrides "key=value"
// (value parsed as a YAML scalar). Throws lt::Error.
TrainConfig parse_config(const std::string& yaml_text, const std::string& source,
                         const std::vector<std::string>& overrides = {});
TrainConfig load_config(const std::filesystem::path& file, const std::vector<std::string>& overrides = {});

// Checks cross-field constraints (positive sizes, byte strings, planner names). Throws lt::Error.
void validate_config(const TrainConfig& c);

// A count of layers >= min (device_update_layers: 0, gradient_ring_depth: 1), or nullopt for "auto". Throws lt::Error
// "<what> must be auto or a count of layers >= <min>, got '<v>'" (`what`: the key or the option) for anything else.
std::optional<int64_t> parse_auto_count(const std::string& v, const std::string& what, int64_t min);

// The nearest key by edit distance, or "" when none is close (distance > max(2, len/3)).
std::string nearest_key(const std::string& key);
size_t edit_distance(const std::string& a, const std::string& b);

// YAML dump of the effective config (written next to the checkpoints).
std::string config_to_yaml(const TrainConfig& c);

}  // namespace lt::train
