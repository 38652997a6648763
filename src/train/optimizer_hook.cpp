#include "train/optimizer_hook.h"

#include "core/error.h"
#include "optim/layout_spec.h"

namespace lt::train {

AdamWHook::AdamWHook(const ModelLayout& layout, HostState& state, const OptimizerSetup& s) : state_(state) {
  optim::AdamWConfig c;
  c.beta1 = s.beta1;
  c.beta2 = s.beta2;
  c.eps = s.eps;
  c.groups = {{1.0f, s.weight_decay}, {1.0f, 0.0f}};
  c.max_grad_norm = s.max_grad_norm;
  c.on_nonfinite = optim::NonFinitePolicy::Skip;
  c.threads = s.threads;
  std::vector<optim::UnitSpec> units;
  for (const auto& u : layout.units) units.push_back(optim::unit_spec_from_layout(u, s.kind, &s.tensors_8bit));
  opt_ = std::make_unique<optim::CpuAdamW>(std::move(units), c);
  bf16_stream_ = state.stream_dtype() == DType::BF16;
}

void AdamWHook::grad_ready(int64_t unit, double sumsq) {
  // The optimizer fixes the exact global norm (and the clip factor) once every unit reported its
  // partial sum of squares, then runs the queued updates.
  opt_->add_grad_sumsq(int(unit), sumsq);
  optim::UnitBuffers b;
  b.master = state_.master(unit);
  b.grad = state_.grad(unit);
  b.bf16 = bf16_stream_ ? static_cast<bf16_t*>(state_.stream(unit)) : nullptr;
  opt_->submit(int(unit), b);
}

void AdamWHook::wait(int64_t unit) {
  opt_->wait(int(unit));
  // An fp32 streaming copy (CPU backend) is a plain copy of the master: refresh it after the update.
  if (!bf16_stream_) state_.refresh_stream(unit);
}

void AdamWHook::wait_all() {
  for (int64_t u = 0; u < state_.units(); ++u) wait(u);
}

}  // namespace lt::train
