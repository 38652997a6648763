#include "exec/device_update.h"

#include "core/error.h"
#include "exec/device_q8.h"
#include "optim/adamw_kernels.h"

namespace lt {
namespace {

constexpr int64_t kAlign = 256;
int64_t aligned(int64_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
int64_t q8_blocks(int64_t n) { return (n + optim::kQ8Block - 1) / optim::kQ8Block; }
// Device bytes of one tensor's moments: fp32 m and v, or 8-bit codes and block scales.
int64_t moment_bytes(const UpdateHook::DeviceTensor& t) {
  return t.q8() ? 2 * aligned(t.numel) + 2 * aligned(q8_blocks(t.numel) * 4) : 2 * aligned(t.numel * 4);
}
std::string unit_name(int64_t u) { return u == 0 ? "the embedding" : fmt::format("layer {}", u - 1); }

}  // namespace

DeviceUpdate::DeviceUpdate(Backend& be, HostState& st, int64_t unit, void* weights, const float* grad,
                           int micro_batches)
    : be_(be), st_(st), unit_(unit), weights_(weights), grad_(grad) {
  const bool aliased = st.storage() == MasterStorage::Aliased;
  split_ = st.storage() == MasterStorage::Split && st.stream_dtype() == DType::BF16;
  LT_CHECK(aliased || split_,
           "executor: the update of {} on the device needs fp32 master weights held as the streaming copy or split "
           "around a bf16 one (master storage here: {}); use master_weights fp32",
           unit_name(unit), master_storage_name(st.storage()));
  LT_CHECK(be.dtypes().grad == DType::F32, "executor: the update on the device reads fp32 gradients, the backend "
           "writes {}", dtype_name(be.dtypes().grad));
  const int64_t n = st.numel(unit);
  if (!weights_) {
    own_w_ = Buffer(be, MemKind::Device, n * int64_t(dtype_size(st.stream_dtype())), "optim.device.weights");
    weights_ = own_w_.data();
  }
  // (A unit whose remainders are in the optimizer's NVMe image has its moments there too: never updated here.)
  LT_CHECK(!st.remainders_on_nvme(unit), "internal: the device update of {}, whose master remainders are on NVMe",
           unit_name(unit));
  if (split_) lo_ = Buffer(be, MemKind::Device, n * 2, "optim.device.remainders");
  if (micro_batches > 1) {
    acc_ = Buffer(be, MemKind::Device, n * 4, "optim.device.grad_sum");
    grad_ = acc_.as<float>();
  } else if (!grad_) {
    own_g_ = Buffer(be, MemKind::Device, n * 4, "optim.device.grad");
    grad_ = own_g_.as<float>();
  }
}

int64_t DeviceUpdate::device_bytes() const {
  return own_w_.bytes() + own_g_.bytes() + lo_.bytes() + moments_.bytes() + acc_.bytes();
}

void DeviceUpdate::allocate_moments(const std::vector<UpdateHook::DeviceTensor>& host) {
  int64_t total = 0;
  for (const auto& t : host) total += moment_bytes(t);
  if (!moments_ || moments_.bytes() != total) moments_ = Buffer(be_, MemKind::Device, total, "optim.device.moments");
  tensors_.clear();
  char* at = moments_.as<char>();
  for (const auto& h : host) {
    Tensor t{h};
    const int64_t b = h.q8() ? aligned(h.numel) : aligned(h.numel * 4);
    t.m = at;
    t.v = at + b;
    at += 2 * b;
    if (h.q8()) {
      const int64_t sb = aligned(q8_blocks(h.numel) * 4);
      t.ms = reinterpret_cast<float*>(at);
      t.vs = reinterpret_cast<float*>(at + sb);
      at += 2 * sb;
    }
    tensors_.push_back(t);
  }
}

void DeviceUpdate::transfer(bool to_device) {
  const Lane lane = to_device ? Lane::H2D : Lane::D2H;
  const OpLabel l{to_device ? "optim.device.load" : "optim.device.store", -1, int32_t(unit_)};
  auto copy = [&](void* dev, const void* host, int64_t bytes) {
    if (to_device) be_.copy(lane, dev, host, bytes, l);
    else be_.copy(lane, const_cast<void*>(host), dev, bytes, l);
  };
  const int64_t n = st_.numel(unit_);
  const optim::UnitBuffers b = st_.update_buffers(unit_);
  copy(weights_, st_.stream(unit_), n * (split_ ? 2 : 4));
  if (split_) copy(lo_.data(), b.lo, n * 2);
  for (const Tensor& t : tensors_) {
    const auto& h = t.host;
    if (h.q8()) {
      copy(t.m, h.mq, h.numel);
      copy(t.v, h.vq, h.numel);
      copy(t.ms, h.ms, q8_blocks(h.numel) * 4);
      copy(t.vs, h.vs, q8_blocks(h.numel) * 4);
    } else {
      copy(t.m, h.m, h.numel * 4);
      copy(t.v, h.v, h.numel * 4);
    }
  }
}

void DeviceUpdate::load(UpdateHook& hook) {
  allocate_moments(hook.device_tensors(unit_));
  transfer(true);
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
  const Q8Maps& maps = device_q8_maps();
  for (size_t k = 0; k < s.size(); ++k) {
    const Tensor& t = tensors_[k];
    const int64_t off = t.host.offset, n = t.host.numel;
    float* p = split_ ? nullptr : static_cast<float*>(weights_) + off;
    bf16_t* hi = split_ ? static_cast<bf16_t*>(weights_) + off : nullptr;
    uint16_t* lo = split_ ? lo_.as<uint16_t>() + off : nullptr;
    const float* g = grad_ + off;
    if (t.host.q8())
      be_.adamw_step_q8(s[k], maps, p, hi, lo, g, reinterpret_cast<uint8_t*>(t.m), reinterpret_cast<uint8_t*>(t.v),
                        t.ms, t.vs, n, l);
    else be_.adamw_step(s[k], p, hi, lo, g, reinterpret_cast<float*>(t.m), reinterpret_cast<float*>(t.v), n, l);
  }
}

void DeviceUpdate::store() {
  if (!loaded_) return;
  be_.wait(Lane::D2H, be_.record(Lane::Compute));
  transfer(false);
  be_.synchronize();
}

}  // namespace lt
