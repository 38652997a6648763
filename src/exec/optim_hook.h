// Plugs optim::CpuAdamW into the executor's UpdateHook: each unit's final gradient is submitted to the
// asynchronous per-unit updater with its partial sum of squares; the updater fixes the global norm
// (exact clipping) when the last unit arrives and writes master and bf16 streaming copy in one pass.
// Call begin_step(lr) before each Executor::train_step.
//
// Two ways to make one: around an optimizer the caller owns (tests, benches: any AdamWConfig), or from
// an OptimizerSetup (the trainer): parameter groups decay / no decay, state format per tensor (fp32,
// 8-bit, or hybrid with the plan's 8-bit tensors), non-finite gradients skip the step. Either way
// optimizer() gives the CpuAdamW for state save/load and step info.
#pragma once
#include <memory>
#include <set>
#include <string>

#include "exec/executor.h"
#include "nvme/io_queue.h"
#include "optim/layout_spec.h"
#include "optim/optimizer.h"

namespace lt {

struct OptimizerSetup {
  float weight_decay = 0.0f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float max_grad_norm = 1.0f;
  int threads = 0;
  optim::OptimizerKind kind = optim::OptimizerKind::AdamW;
  std::set<std::string> tensors_8bit;  // hybrid: full HF names with 8-bit moments (the plan's choice)
  uint64_t sr_seed = 0;                // bf16-sr masters: the stochastic rounding's seed
  // Units whose moments live on NVMe under nvme_dir (optim/nvme_moments.h): every layer unit, and/or the
  // listed unit indices (the planner's choice).
  bool nvme_all_layers = false;
  std::set<int64_t> nvme_units;
  // Split fp32 masters: those units' master remainders in their NVMe images too (StatePlacement::nvme_remainders;
  // optim::UnitSpec::remainders_on_nvme): 2 B/param less DRAM, 2 B/param more disk I/O each way per step.
  bool nvme_remainders = false;
  std::string nvme_dir;
  IoQueueShape nvme_queue;  // the io_uring queue of the moments' files (nvme/io_queue.h)
};

// The optimizer's step constants as the backend's device update takes them (Backend::adamw_step).
inline AdamWStepScalars device_scalars(const optim::AdamWScalars& s) {
  return {s.decay, s.w1, s.beta2, s.w2, s.eps, s.bc2_sqrt, s.neg_step_size, s.grad_scale, s.beta1, s.inv_bc2_sqrt};
}

// The optimizer's configuration for setup s and the host state's master format (one definition for the
// single-process hook and the data-parallel shard optimizers).
optim::AdamWConfig adamw_config(const OptimizerSetup& s, optim::MasterFormat master);

class AdamWHook final : public UpdateHook {
 public:
  // Borrows opt (which must outlive the hook).
  AdamWHook(optim::CpuAdamW& opt, HostState& st);
  // Owns an optimizer built for the layout's units from s.
  AdamWHook(const ModelLayout& layout, HostState& st, const OptimizerSetup& s);

  // With gradients held on the device the previous step's gradients are still being handed over
  // (grad_staged) during the next train_step, so the optimizer's step begins at the first gradient
  // report of the new step (grad_ready / grad_norm_part) instead of here.
  void begin_step(float lr);
  void grad_ready(int64_t unit, double sumsq) override;
  void grad_norm_part(int64_t unit, double sumsq) override;
  void grad_staged(int64_t unit, const void* grad, DType dtype) override;
  void wait(int64_t unit) override;
  void wait_all();
  void prioritize(int64_t unit, std::vector<std::pair<int64_t, int64_t>> ranges) override;
  // The hinted ranges only when the streaming copy is the master's own storage (no rebuild after the update).
  void wait_first(int64_t unit) override;
  std::vector<DeviceTensor> device_tensors(int64_t unit) override;
  bool device_step(int64_t unit, std::vector<AdamWStepScalars>& per_tensor) override;
  optim::CpuAdamW& optimizer() { return *opt_; }

 private:
  void submit(int64_t unit, const optim::UnitBuffers& b);

  std::unique_ptr<optim::CpuAdamW> owned_;
  optim::CpuAdamW* opt_;
  HostState& st_;
  void begin_deferred();

  std::vector<char> rebuild_;  // units whose rebuilt streaming copy is stale (HostState::stream_rebuilt)
  bool deferred_ = false;      // begin_step(deferred_lr_) still to do (gradients held on the device)
  float deferred_lr_ = 0;
};

}  // namespace lt
