// Connects the CPU AdamW (src/optim) to the executor's per-unit update hook (src/exec):
// unit specs with parameter groups (decay / no decay) and state formats (fp32 or 8-bit per tensor),
// the partial sums of squares that fix the exact global-norm clip, and the streaming copy refresh.
#pragma once
#include <memory>
#include <set>
#include <string>

#include "exec/executor.h"
#include "optim/layout_spec.h"
#include "optim/optimizer.h"

namespace lt::train {

struct OptimizerSetup {
  float lr = 1e-3f, weight_decay = 0.0f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float max_grad_norm = 1.0f;
  int threads = 0;
  optim::OptimizerKind kind = optim::OptimizerKind::AdamW;
  std::set<std::string> tensors_8bit;  // hybrid: full HF names with 8-bit moments (the plan's choice)
};


class AdamWHook final : public UpdateHook {
 public:
  AdamWHook(const ModelLayout& layout, HostState& state, const OptimizerSetup& s);
  void begin_step(float lr) { opt_->begin_step(lr); }
  void grad_ready(int64_t unit, double sumsq) override;
  void wait(int64_t unit) override;
  void wait_all();
  optim::CpuAdamW& optimizer() { return *opt_; }

 private:
  HostState& state_;
  std::unique_ptr<optim::CpuAdamW> opt_;
  bool bf16_stream_;
};

}  // namespace lt::train
