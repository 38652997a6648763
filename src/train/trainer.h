// The training loop of `lazytrain train`: data, plan, executor, optimizer, LR schedule, metrics,
// periodic evaluation, atomic checkpoints with exact resume, clean stop on SIGINT/SIGTERM, and an
// optional exact-match evaluation at the end.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "dist/communicator.h"
#include "infer/decode_device.h"
#include "train/config.h"
#include "train/metrics.h"

namespace lt {
class HostState;
struct ModelLayout;
}  // namespace lt

namespace lt::train {

struct BackendChoice {
  std::unique_ptr<Backend> backend;
  std::string device_name;  // for the MFU peak ("NVIDIA H200", "cpu")
  bool gpu = false;
};
// Makes the backend for a model given the config (backend: auto|cpu|cuda) and the plan's budgets.
using BackendFactory =
    std::function<BackendChoice(const ModelConfig&, const TrainConfig&, int64_t device_budget, int64_t host_budget)>;
// The CPU backend (always available).
BackendChoice make_cpu_backend(const ModelConfig& m, const TrainConfig& c, int64_t device_budget, int64_t host_budget);

// Whether the run will use a GPU and its name, decided before planning (the planner's GPU profiler
// must measure before the backend takes the device memory).
struct DeviceProbe {
  bool gpu = false;
  std::string name = "cpu";
};

// The communicator of a data-parallel rank (`lazytrain launch -n N`, N > 1).
using CommunicatorFactory = std::function<std::unique_ptr<dist::Communicator>(const dist::DistEnv&, const TrainConfig&)>;

struct TrainHooks {
  BackendFactory make_backend;            // null: CPU backend; `cuda` in the config then fails
  std::function<DeviceProbe(const TrainConfig&)> probe_device;  // null: CPU
  GpuDecodeHooks gpu_decode;              // the final exact-match evaluation decodes on the GPU with these
                                          // when training ran on a GPU backend (empty: on the CPU)
  int64_t stop_after_steps = -1;          // tests: behave as if SIGTERM arrived after this many steps of this run
  std::function<void(const StepMetrics&)> on_step;
  // tests: runs before each step (its global step number, 1-based) once the previous updates are done, with the host
  // state and its layout: may change the weights (HostState::write_master) to inject a fault.
  std::function<void(int64_t step, HostState& st, const ModelLayout& layout)> before_step;
  // tests: true behaves as if SIGTERM arrived before micro-batch `next` (0-based, >= 1) of global step `step`.
  std::function<bool(int64_t step, int64_t next)> stop_before_micro_batch;
  bool install_signal_handlers = true;
  CommunicatorFactory make_communicator;  // null: dist::ShmCommunicator (ranks as processes on one host)
};

struct TrainResult {
  int64_t global_step = 0;                // steps done (including those before a resume)
  int64_t total_steps = 0;
  std::vector<double> losses;             // every step's loss since the start of training (resumed runs too)
  bool interrupted = false;
  int64_t skipped_steps = 0;              // steps whose update was skipped for a non-finite gradient norm (resumed
                                          // runs: since the start of training)
  int64_t nonfinite_loss_steps = 0;       // steps with a non-finite loss but a finite norm (update applied)
  std::filesystem::path last_checkpoint;
  double train_seconds = 0;
  double exact_match = -1;                // do_eval_dataset result, -1 if not run
  int64_t eval_samples = 0;
};

TrainResult run_training(const TrainConfig& cfg, const TrainHooks& hooks = {});

}  // namespace lt::train
