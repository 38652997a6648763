// The parts of `run_training` (trainer.cpp) that set a run up and close it: the output directory and
// resume point, the tokenised data, the step shape and LR schedule, the optimizer and trainer state,
// a step's metrics, and the final exact-match evaluation. Internal to src/train.
#pragma once
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "data/batch.h"
#include "data/prepare.h"
#include "exec/executor.h"
#include "exec/optim_hook.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/model_setup.h"
#include "train/output_lock.h"
#include "train/planning.h"
#include "train/trainer.h"

namespace lt::train {

namespace fs = std::filesystem;

// Creates output_dir and takes its lock (the run keeps `lock` until it ends; a second run into the
// same directory fails here naming this one), then returns the checkpoint to resume from
// (resume_from_checkpoint), after clearing a previous run's files when overwrite_output_dir allows it.
std::optional<fs::path> prepare_output_dir(const OutputSection& cfg, OutputLock& lock);

// Tokenised train/validation data, every id checked against the model's vocabulary.
data::PreparedData load_training_data(const TrainConfig& cfg, const ModelSetup& ms);

// Micro-batch shape, steps and LR schedule of the run. Under `lazytrain launch -n N` the global batch is
// per_device_train_batch_size x gradient_accumulation_steps x N rows (HF Trainer / DeepSpeed): each rank
// runs rank_ga = gradient_accumulation_steps micro-batches of `batch` rows, ga = rank_ga x N.
struct StepShape {
  int64_t seq = 0, batch = 0;
  int64_t ga = 1;       // micro-batches of the global batch (drawn per optimizer step)
  int64_t rank_ga = 1;  // of them, the micro-batches one process runs
  int64_t world = 1;
  int64_t batches_per_epoch = 0, updates_per_epoch = 0, total_steps = 0;
  LrSchedule sched;
};
// seq: packing fills cutoff_len; padding needs only the longest sample (rounded up to 8).
int64_t sequence_length(const DataSection& cfg, const data::PreparedData& data);
data::LoaderOptions loader_options(const TrainConfig& cfg, int64_t seq, int32_t pad_id);
StepShape step_shape(const ScheduleSection& cfg, int64_t seq, int64_t batches_per_epoch, int world = 1);
// "batch 16 x 2 accumulation" (one process), "batch 16 x 1 accumulation x 2 ranks" (launch -n 2).
std::string batch_description(const StepShape& s);

OptimizerSetup optimizer_setup(const TrainConfig& cfg, const TrainingPlan& tp, bool gpu);
// How the host state stores the model: the plan's placement (master mode, gradient home; core/model_state.h).
HostStateOptions host_state_options(const TrainingPlan& tp);
// The seed of bf16-sr's stochastic rounding: derived from the run's seed (saved in checkpoints).
uint64_t rounding_seed(uint64_t seed);
// Writes the starting weights (random, pretrained; nothing for a checkpoint, which resume_from loads)
// into the host state unit by unit.
void write_initial_weights(const ModelSetup& ms, HostState& st, int threads);

// A fresh trainer state for this run's shape and plan.
TrainerState initial_trainer_state(const TrainConfig& cfg, const StepShape& shape, const TrainingPlan& tp,
                                   const ModelSetup& ms);
// Loads the checkpoint's weights, moments and data position into st / the optimizer / loader and ts,
// after checking it was made for the same data shape and optimizer. load_optimizer reads the
// checkpoint's optimizer.bin into the run's optimizer (opt.load, or a data-parallel rank's shard of it).
// ts keeps the checkpoint's model name (the run's base model). A checkpoint already at the run's last step
// prints nothing_to_do_message.
void resume_from(const fs::path& ckpt, const TrainConfig& cfg, const ModelSetup& ms, HostState& st,
                 optim::CpuAdamW& opt, const std::function<void(const fs::path&)>& load_optimizer,
                 data::DataLoader& loader, TrainerState& ts);
// "nothing to do: checkpoint-N is at step N = max_steps; raise max_steps to train further" (or the epochs' count).
std::string nothing_to_do_message(const fs::path& ckpt, const ScheduleSection& cfg, const TrainerState& ts);

// The command that resumes a stopped run (printed when a signal stops it).
std::string resume_command(const TrainConfig& cfg);

// One step's metrics record.
struct StepFigures {
  const StepResult* r = nullptr;
  double grad_norm = 0, lr = 0, step_time = 0;
  int64_t nonpad = 0;
  double model_flops_attn = -1;  // this step's attention-inclusive FLOPs (its rows' segments); < 0: the FlopModel's
};
StepMetrics step_metrics(const TrainerState& ts, const StepShape& shape, const StepFigures& f, const FlopModel& flops,
                         double peak, bool gpu, const TrainingPlan& tp);

// The held-out exact-match evaluation after training (do_eval_dataset): on the GPU that trained when
// the hooks allow it (then the executor is released first: its device buffers go back to the arena),
// else on the CPU.
void final_evaluation(const TrainConfig& cfg, const TrainHooks& hooks, const ModelSetup& ms,
                      const data::PreparedData& data, HostState& st, Backend& be, bool gpu,
                      std::unique_ptr<Executor>& executor, MetricsLogger& logger, int64_t step, TrainResult& result);

}  // namespace lt::train
