// Plugs optim::CpuAdamW into the executor's UpdateHook: each unit's final gradient is submitted to the
// asynchronous per-unit updater with its partial sum of squares; the updater fixes the global norm
// (exact clipping) when the last unit arrives and writes master and bf16 streaming copy in one pass.
// The trainer calls opt.begin_step(lr) before each Executor::train_step.
#pragma once
#include "exec/executor.h"
#include "optim/optimizer.h"

namespace lt {

class AdamWHook final : public UpdateHook {
 public:
  AdamWHook(optim::CpuAdamW& opt, HostState& st) : opt_(opt), st_(st) {}
  void grad_ready(int64_t unit, double sumsq) override {
    optim::UnitBuffers b;
    b.master = st_.master(unit);
    b.grad = st_.grad(unit);
    // fp32 streaming (CPU backend): the master is the streaming copy, nothing else to write.
    b.bf16 = st_.aliased() ? nullptr : static_cast<bf16_t*>(st_.stream(unit));
    opt_.submit(int(unit), b);
    opt_.add_grad_sumsq(int(unit), sumsq);
  }
  void wait(int64_t unit) override { opt_.wait(int(unit)); }

 private:
  optim::CpuAdamW& opt_;
  HostState& st_;
};

}  // namespace lt
