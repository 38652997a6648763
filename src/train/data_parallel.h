// `lazytrain train` as one rank of `lazytrain launch -n N` (docs/distributed.md, "Trainer"): the
// trainer's side of src/dist. Internal to src/train (trainer.cpp).
//
// per_device_train_batch_size is per rank (HF Trainer / DeepSpeed): the global batch is N x
// gradient_accumulation_steps micro-batches of per_device_train_batch_size rows. Every rank loads the same
// data and draws the same global batch; rank r runs its contiguous gradient_accumulation_steps
// micro-batches (dist::rank_share), normalised by the global batch's loss tokens, so that the step is
// that of one process with gradient_accumulation_steps x N (bit for bit with one micro-batch per rank). Each rank
// holds the full host state and the optimizer state of its shard of every unit (ZeRO-1 on the host,
// dist::ShardedUpdateHook); weights are all-gathered after each unit's update. Rank 0 alone writes the
// output directory: metrics.jsonl (with every rank's figures), console lines and checkpoints (the
// single-process layout, optimizer.bin merged from the shards), so a checkpoint resumes with any N.
#pragma once
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/data_parallel.h"
#include "dist/shard.h"
#include "exec/optim_hook.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/output_lock.h"
#include "train/planning.h"
#include "train/trainer.h"

namespace lt::train {

namespace fs = std::filesystem;

// Refuses, naming the config field, what the data-parallel path does not run: master_weights bf16-sr,
// gradients held on the device, optimizer moments on NVMe.
void check_data_parallel_config(const PlacementSection& cfg, const TrainingPlan& tp, int world);

// threads: 0 (all cores) under `lazytrain launch` with several ranks on this host becomes this rank's
// share of the cores (LT_LOCAL_WORLD_SIZE), so that the ranks do not oversubscribe the CPU.
TrainConfig with_rank_threads(const TrainConfig& cfg);

class DataParallel {
 public:
  // env.world > 1; the communicator from `factory` (TrainHooks::make_communicator; null:
  // ShmCommunicator with LT_COMM_TIMEOUT_S).
  DataParallel(const dist::DistEnv& env, const TrainConfig& cfg, const CommunicatorFactory& factory);
  dist::Communicator& comm() { return *comm_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  bool leader() const { return rank_ == 0; }

  // Rank 0 prepares the output directory (prepare_output_dir: it alone takes the directory's lock, into
  // `lock`; the others' stays empty and they fail with it when it cannot), then every rank resolves the
  // same resume point.
  std::optional<fs::path> prepare_output_dir(const OutputSection& cfg, OutputLock& lock);

  // Every rank must have planned the same optimizer state formats and placement (each rank runs the
  // planner on its own measurements): a clear error on every rank when they differ.
  void check_same_plan(const TrainingPlan& tp);
  // The config this rank plans with: rank 0's writes plan.json and plan_report.txt to the output
  // directory, the others' nothing.
  TrainConfig planning_config(const TrainConfig& cfg) const;

  // The shard optimizer and its hook, once the host state holds the starting weights.
  void attach(const ModelLayout& layout, HostState& st, const OptimizerSetup& s);
  UpdateHook& hook() { return *hook_; }
  optim::CpuAdamW& optimizer() { return *opt_; }

  // One optimizer step on this rank's share of the global micro-batches: the result carries the
  // global loss, loss tokens and tokens (rows); `local` gets this rank's own result.
  StepResult step(Executor& ex, const std::vector<MicroBatch>& global_mbs, float lr, StepResult* local = nullptr);
  // Every update finished and every rank's master current (before checkpoints, evaluation).
  void wait_all() { hook_->gather_masters(); }
  // True on every rank when it is true on any (a stop request must stop all ranks after the same step).
  bool any(bool flag);
  double comm_seconds() const { return hook_->comm_seconds(); }  // cumulative, this rank
  // Every rank's figures of the step (collective; all ranks get them).
  std::vector<RankFigures> gather(const RankFigures& mine);

  // Collective. Each rank writes its shard state; rank 0 then runs `write` (the checkpoint) with a
  // function that writes the merged optimizer.bin at a path. Rank 0's error is rethrown on rank 0 and
  // reported on the others.
  void save(const std::function<void(const std::function<void(const fs::path&)>& write_optimizer)>& write);
  // Loads this rank's shard of a checkpoint's optimizer.bin (any world size wrote it).
  void load_optimizer(const fs::path& optimizer_bin);

  // Runs fn on rank 0 only; every rank learns whether it succeeded (collective). The others wait up to
  // kLeaderPhaseTimeoutS (or the communicator's timeout if longer): rank 0 may write a checkpoint of
  // hundreds of GB meanwhile.
  void on_leader(const std::function<void()>& fn, const char* what);
  static constexpr double kLeaderPhaseTimeoutS = 3600;

 private:
  std::unique_ptr<dist::Communicator> comm_;
  int rank_ = 0, world_ = 1;
  fs::path scratch_;  // shard state files (the rendezvous directory, not the output directory)
  std::vector<optim::UnitSpec> full_specs_;
  dist::ShardLayout shards_;
  std::unique_ptr<optim::CpuAdamW> opt_;
  std::unique_ptr<dist::ShardedUpdateHook> hook_;
};

}  // namespace lt::train
