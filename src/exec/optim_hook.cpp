#include "exec/optim_hook.h"

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "nvme/nvme_store.h"
#include "optim/nvme_moments.h"

namespace lt {

void UpdateHook::grad_norm_part(int64_t unit, double) {
  fail("internal: this update hook does not take gradients held on the device (unit {})", unit);
}
void UpdateHook::grad_staged(int64_t unit, const void*, DType) {
  fail("internal: this update hook does not take gradients held on the device (unit {})", unit);
}

std::vector<UpdateHook::DeviceTensor> UpdateHook::device_tensors(int64_t unit) {
  fail("internal: this update hook cannot update unit {} on the device", unit);
}
bool UpdateHook::device_step(int64_t unit, std::vector<AdamWStepScalars>&) {
  fail("internal: this update hook cannot update unit {} on the device", unit);
}

optim::AdamWConfig adamw_config(const OptimizerSetup& s, optim::MasterFormat master) {
  optim::AdamWConfig c;
  c.beta1 = s.beta1;
  c.beta2 = s.beta2;
  c.eps = s.eps;
  c.groups = {{1.0f, s.weight_decay}, {1.0f, 0.0f}};
  c.max_grad_norm = s.max_grad_norm;
  c.on_nonfinite = optim::NonFinitePolicy::Skip;
  c.threads = s.threads;
  c.master = master;
  c.sr_seed = s.sr_seed;
  c.nvme_dir = s.nvme_dir;
  if (!s.nvme_dir.empty()) c.nvme_io = default_io(s.nvme_queue);
  return c;
}

AdamWHook::AdamWHook(optim::CpuAdamW& opt, HostState& st)
    : opt_(&opt), st_(st), rebuild_(size_t(st.units()), 0) {
  LT_CHECK(opt.config().master == st.optimizer_format(),
           "internal: optimizer masters are {}, the host state holds {}", optim::master_format_name(opt.config().master),
           master_storage_name(st.storage()));
  st.attach_nvme_remainders(opt);  // units with UnitSpec::remainders_on_nvme, if any
}

AdamWHook::AdamWHook(const ModelLayout& layout, HostState& st, const OptimizerSetup& s)
    : st_(st), rebuild_(size_t(st.units()), 0) {
  const optim::AdamWConfig c = adamw_config(s, st.optimizer_format());
  std::vector<optim::UnitSpec> units;
  for (const auto& u : layout.units) {
    units.push_back(optim::unit_spec_from_layout(u, s.kind, &s.tensors_8bit));
    units.back().moments_on_nvme =
        (s.nvme_all_layers && u.kind == UnitKind::Layer) || s.nvme_units.count(int64_t(units.size() - 1));
    // Only split masters have remainders (fp32 arrays, the CPU backend's aliased fp32 and bf16-sr do not).
    units.back().remainders_on_nvme =
        s.nvme_remainders && units.back().moments_on_nvme && c.master == optim::MasterFormat::Split;
  }
  owned_ = std::make_unique<optim::CpuAdamW>(std::move(units), c);
  opt_ = owned_.get();
  st.attach_nvme_remainders(*opt_);
  const optim::MomentHomes h = opt_->moment_homes();
  if (h.nvme > 0)
    log_info("optimizer moments: {} in DRAM, {} on NVMe under {}{} ({} DRAM staging; {} queue {})",
             format_bytes(double(h.dram)), format_bytes(double(h.nvme)), s.nvme_dir,
             h.remainders > 0 ? fmt::format(" (with {} of master remainders)", format_bytes(double(h.remainders))) : "",
             format_bytes(double(h.staging)), c.nvme_io ? c.nvme_io->name() : "default", s.nvme_queue.describe());
}

void AdamWHook::begin_step(float lr) {
  if (st_.options().grads == GradHome::Host) return opt_->begin_step(lr);
  deferred_ = true;
  deferred_lr_ = lr;
}

void AdamWHook::begin_deferred() {
  if (!deferred_) return;
  deferred_ = false;
  opt_->begin_step(deferred_lr_);
}

void AdamWHook::submit(int64_t unit, const optim::UnitBuffers& b) {
  opt_->submit(int(unit), b);
  rebuild_[size_t(unit)] = st_.stream_rebuilt();
}

void AdamWHook::grad_ready(int64_t unit, double sumsq) {
  begin_deferred();
  submit(unit, st_.update_buffers(unit));
  // The optimizer fixes the exact global norm (and the clip factor) once every unit reported its
  // partial sum of squares, then runs the queued updates.
  opt_->add_grad_sumsq(int(unit), sumsq);
}

void AdamWHook::grad_norm_part(int64_t unit, double sumsq) {
  begin_deferred();
  opt_->add_grad_sumsq(int(unit), sumsq);
}

void AdamWHook::grad_staged(int64_t unit, const void* grad, DType dtype) {
  LT_CHECK(dtype == DType::F32 || dtype == DType::BF16, "internal: staged gradient of unit {} in {}", unit,
           dtype_name(dtype));
  optim::UnitBuffers b = st_.update_buffers(unit);
  b.grad = dtype == DType::F32 ? static_cast<const float*>(grad) : nullptr;
  b.grad_bf16 = dtype == DType::BF16 ? static_cast<const bf16_t*>(grad) : nullptr;
  submit(unit, b);
}

void AdamWHook::wait(int64_t unit) {
  opt_->wait(int(unit));
  if (rebuild_[size_t(unit)]) {
    st_.refresh_stream(unit);
    rebuild_[size_t(unit)] = 0;
  }
}

void AdamWHook::prioritize(int64_t unit, std::vector<std::pair<int64_t, int64_t>> ranges) {
  opt_->set_first_ranges(int(unit), std::move(ranges));
}

void AdamWHook::wait_first(int64_t unit) {
  if (rebuild_[size_t(unit)] || st_.stream_rebuilt()) return wait(unit);
  opt_->wait_first(int(unit));
}

std::vector<UpdateHook::DeviceTensor> AdamWHook::device_tensors(int64_t unit) {
  std::vector<DeviceTensor> v;
  const auto& spec = opt_->units().at(size_t(unit));
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    const optim::MomentArrays a = opt_->host_moments(int(unit), int(t));
    DeviceTensor d{spec.tensors[t].offset, spec.tensors[t].numel};
    if (opt_->is_8bit(int(unit), int(t))) {
      d.mq = a.mq, d.vq = a.vq, d.ms = a.ms, d.vs = a.vs;
    } else {
      d.m = a.m, d.v = a.v;
    }
    v.push_back(d);
  }
  return v;
}

bool AdamWHook::device_step(int64_t unit, std::vector<AdamWStepScalars>& per_tensor) {
  per_tensor.clear();
  LT_CHECK(opt_->norm_known(), "internal: device_step({}) before the step's norm is known", unit);
  if (opt_->last_step().skipped) return false;
  const auto& spec = opt_->units().at(size_t(unit));
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    per_tensor.push_back(device_scalars(opt_->step_scalars(int(unit), int(t))));
  }
  return true;
}

void AdamWHook::wait_all() {
  for (int64_t u = 0; u < st_.units(); ++u) wait(u);
}

}  // namespace lt
