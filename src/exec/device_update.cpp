#include "exec/device_update.h"

#include "core/error.h"

namespace lt {

DeviceUpdate::DeviceUpdate(Backend& be, HostState& st, int64_t unit, void* weights, const float* grad,
                           int micro_batches)
    : be_(be), st_(st), unit_(unit), weights_(weights), grad_(grad) {
  const bool aliased = st.storage() == MasterStorage::Aliased;
  split_ = st.storage() == MasterStorage::Split && st.stream_dtype() == DType::BF16;
  LT_CHECK(aliased || split_,
           "executor: the embedding's update on the device needs fp32 master weights held as the streaming copy or "
           "split around a bf16 one (master storage here: {}); use embedding_update: host",
           master_storage_name(st.storage()));
  LT_CHECK(be.dtypes().grad == DType::F32, "executor: the embedding's update on the device reads fp32 gradients, the "
           "backend writes {}", dtype_name(be.dtypes().grad));
  const int64_t n = st.numel(unit);
  if (split_) lo_ = Buffer(be, MemKind::Device, n * 2, "optim.device.remainders");
  m_ = Buffer(be, MemKind::Device, n * 4, "optim.device.moments");
  v_ = Buffer(be, MemKind::Device, n * 4, "optim.device.moments");
  if (micro_batches > 1) {
    acc_ = Buffer(be, MemKind::Device, n * 4, "optim.device.grad_sum");
    grad_ = acc_.as<float>();
  }
}

void DeviceUpdate::transfer(UpdateHook& hook, bool to_device) {
  const Lane lane = to_device ? Lane::H2D : Lane::D2H;
  const OpLabel l{to_device ? "optim.device.load" : "optim.device.store", -1, int32_t(unit_)};
  auto copy = [&](void* dev, void* host, int64_t bytes) {
    if (to_device) be_.copy(lane, dev, host, bytes, l);
    else be_.copy(lane, host, dev, bytes, l);
  };
  const int64_t n = st_.numel(unit_);
  const optim::UnitBuffers b = st_.update_buffers(unit_);
  copy(weights_, st_.stream(unit_), n * (split_ ? 2 : 4));
  if (split_) copy(lo_.data(), b.lo, n * 2);
  for (const auto& t : hook.device_tensors(unit_)) {
    copy(m_.as<float>() + t.offset, t.m, t.numel * 4);
    copy(v_.as<float>() + t.offset, t.v, t.numel * 4);
  }
}

void DeviceUpdate::load(UpdateHook& hook) {
  tensors_ = hook.device_tensors(unit_);
  transfer(hook, true);
  be_.wait(Lane::Compute, be_.record(Lane::H2D));
  loaded_ = true;
}

void DeviceUpdate::update(UpdateHook& hook) {
  LT_CHECK(loaded_, "internal: the device update of unit {} before its first load", unit_);
  std::vector<AdamWStepScalars> s;
  if (!hook.device_step(unit_, s)) return;  // skipped step
  LT_CHECK(s.size() == tensors_.size(), "internal: {} step constants for {} tensors of unit {}", s.size(),
           tensors_.size(), unit_);
  const OpLabel l{"optim.device", -1, int32_t(unit_)};
  for (size_t t = 0; t < s.size(); ++t) {
    const auto& ts = tensors_[t];
    float* m = m_.as<float>() + ts.offset;
    float* v = v_.as<float>() + ts.offset;
    const float* g = grad_ + ts.offset;
    if (split_)
      be_.adamw_step(s[t], nullptr, static_cast<bf16_t*>(weights_) + ts.offset, lo_.as<uint16_t>() + ts.offset, g, m,
                     v, ts.numel, l);
    else be_.adamw_step(s[t], static_cast<float*>(weights_) + ts.offset, nullptr, nullptr, g, m, v, ts.numel, l);
  }
  be_.synchronize();
}

void DeviceUpdate::store(UpdateHook& hook) {
  if (!loaded_) return;
  be_.wait(Lane::D2H, be_.record(Lane::Compute));
  transfer(hook, false);
  be_.synchronize();
}

}  // namespace lt
