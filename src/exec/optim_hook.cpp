#include "exec/optim_hook.h"

namespace lt {

AdamWHook::AdamWHook(const ModelLayout& layout, HostState& st, const OptimizerSetup& s) : st_(st) {
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
  owned_ = std::make_unique<optim::CpuAdamW>(std::move(units), c);
  opt_ = owned_.get();
}

void AdamWHook::grad_ready(int64_t unit, double sumsq) {
  optim::UnitBuffers b;
  b.master = st_.master(unit);
  b.grad = st_.grad(unit);
  // fp32 streaming (CPU backend): the master is the streaming copy, nothing else to write.
  b.bf16 = st_.aliased() ? nullptr : static_cast<bf16_t*>(st_.stream(unit));
  opt_->submit(int(unit), b);
  // The optimizer fixes the exact global norm (and the clip factor) once every unit reported its
  // partial sum of squares, then runs the queued updates.
  opt_->add_grad_sumsq(int(unit), sumsq);
}

void AdamWHook::wait(int64_t unit) { opt_->wait(int(unit)); }

void AdamWHook::wait_all() {
  for (int64_t u = 0; u < st_.units(); ++u) wait(u);
}

}  // namespace lt
