#include "exec/host_state.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/split_master.h"
#include "optim/master_tiles.h"

namespace lt {

const char* master_storage_name(MasterStorage s) {
  switch (s) {
    case MasterStorage::Aliased: return "fp32 (is the streaming copy)";
    case MasterStorage::F32Copy: return "fp32 + bf16 copy";
    case MasterStorage::Split: return "fp32 as bf16 copy + 16-bit remainder";
    case MasterStorage::Bf16: return "bf16 (stochastic rounding)";
  }
  return "?";
}

namespace {

MasterStorage choose_storage(DType stream, const HostStateOptions& o) {
  if (o.master == MasterMode::Bf16Sr) return MasterStorage::Bf16;
  if (stream == DType::F32) return o.split_on_fp32_stream ? MasterStorage::Split : MasterStorage::Aliased;
  return o.fp32_master_array ? MasterStorage::F32Copy : MasterStorage::Split;
}

}  // namespace

HostState::HostState(Backend& be, HostStateOptions o)
    : stream_dtype_(be.dtypes().weight), opt_(std::move(o)), storage_(choose_storage(stream_dtype_, opt_)) {
  LT_CHECK(stream_dtype_ == DType::F32 || stream_dtype_ == DType::BF16,
           "host state: streaming dtype {} unsupported (expected F32 or BF16)", dtype_name(stream_dtype_));
  const auto& units = be.layout().units;
  for (size_t u = 0; u < units.size(); ++u) {
    const bool host_grad = (opt_.grads == GradHome::Host && !opt_.updated_on_device(int64_t(u))) ||
                           std::count(opt_.host_grad_units.begin(), opt_.host_grad_units.end(), int64_t(u)) > 0;
    allocate_unit(be, int64_t(u), units[u].numel, host_grad);
  }
  refresh_all_streams();
  zero_grads();
}

void HostState::allocate_unit(Backend& be, int64_t u, int64_t n, bool host_grad) {
  numel_.push_back(n);
  const int64_t m = std::max<int64_t>(1, n);
  pinned_.emplace_back(be, MemKind::Pinned, m * int64_t(dtype_size(stream_dtype_)), "host.stream_copy");
  void* s = pinned_.back().data();
  std::memset(s, 0, size_t(m) * dtype_size(stream_dtype_));
  stream_ptr_.push_back(s);
  f32_.emplace_back();
  hi_.emplace_back();
  lo_.emplace_back();
  float* f = nullptr;
  bf16_t* hi = nullptr;
  switch (storage_) {
    case MasterStorage::Aliased: f = static_cast<float*>(s); break;
    case MasterStorage::F32Copy: f32_.back().assign(size_t(n), 0.0f); f = f32_.back().data(); break;
    case MasterStorage::Split:
    case MasterStorage::Bf16:
      if (stream_dtype_ == DType::BF16) {
        hi = static_cast<bf16_t*>(s);
      } else {
        hi_.back().assign(size_t(n), 0);
        hi = hi_.back().data();
      }
      if (storage_ == MasterStorage::Split && !opt_.nvme_remainder_units.count(u)) lo_.back().assign(size_t(n), 0);
      break;
  }
  f32_ptr_.push_back(f);
  hi_ptr_.push_back(hi);
  grad_ptr_.push_back(nullptr);
  grad16_ptr_.push_back(nullptr);
  if (host_grad && opt_.host_bf16_grads()) {
    grad_.emplace_back(be, MemKind::Pinned, m * 2, "host.grad");
    grad16_ptr_.back() = grad_.back().as<bf16_t>();
  } else if (host_grad) {
    grad_.emplace_back(be, MemKind::Pinned, m * 4, "host.grad");
    grad_ptr_.back() = grad_.back().as<float>();
  }
  sumsq_.push_back(0.0);
}

optim::MasterFormat HostState::optimizer_format() const {
  switch (storage_) {
    case MasterStorage::Aliased:
    case MasterStorage::F32Copy: return optim::MasterFormat::F32;
    case MasterStorage::Split: return optim::MasterFormat::Split;
    case MasterStorage::Bf16: return optim::MasterFormat::Bf16Sr;
  }
  return optim::MasterFormat::F32;
}

float* HostState::master(int64_t u) {
  LT_CHECK(f32_ptr_[size_t(u)], "host state: the {} master has no fp32 array (use read_master/write_master)",
           master_storage_name(storage_));
  return f32_ptr_[size_t(u)];
}
const float* HostState::master(int64_t u) const { return const_cast<HostState*>(this)->master(u); }

bool HostState::stream_rebuilt() const {
  return stream_dtype_ == DType::F32 && (storage_ == MasterStorage::Split || storage_ == MasterStorage::Bf16);
}

void HostState::check_remainders_home(int64_t u) const {
  LT_CHECK(storage_ != MasterStorage::Split || remainders_on_nvme(u) || !lo_[size_t(u)].empty() || numel(u) == 0,
           "internal: unit {}'s master remainders live in the optimizer's NVMe image (nvme_remainder_units), which "
           "is not attached yet (attach_nvme_remainders before the masters are written or read)", u);
}

void HostState::read_master(int64_t u, int64_t off, int64_t n, float* dst) const {
  const size_t i = size_t(u);
  LT_CHECK(off >= 0 && n >= 0 && off + n <= numel(u), "internal: read_master({}, {}, {}) outside the unit's {} elements",
           u, off, n, numel(u));
  switch (storage_) {
    case MasterStorage::Aliased:
    case MasterStorage::F32Copy: std::memcpy(dst, f32_ptr_[i] + off, size_t(n) * 4); break;
    case MasterStorage::Split:
      if (remainders_on_nvme(u) || lo_[i].empty()) {  // not attached yet: zero remainders, as the image starts
        std::vector<uint16_t> lo(static_cast<size_t>(n), 0);
        if (remainders_on_nvme(u)) rem_opt_->read_remainders(int(u), off, n, lo.data());
        optim::join_tile(hi_ptr_[i] + off, lo.data(), dst, n);
      } else {
        optim::join_tile(hi_ptr_[i] + off, lo_[i].data() + off, dst, n);
      }
      break;
    case MasterStorage::Bf16: optim::widen_tile(hi_ptr_[i] + off, dst, n); break;
  }
}

void HostState::write_master(int64_t u, int64_t off, int64_t n, const float* src) {
  const size_t i = size_t(u);
  LT_CHECK(off >= 0 && n >= 0 && off + n <= numel(u), "internal: write_master({}, {}, {}) outside the unit's {} elements",
           u, off, n, numel(u));
  check_remainders_home(u);
  switch (storage_) {
    case MasterStorage::Aliased:
    case MasterStorage::F32Copy: std::memcpy(f32_ptr_[i] + off, src, size_t(n) * 4); break;
    case MasterStorage::Split:
      if (remainders_on_nvme(u)) {
        // The image is rewritten as a whole (its moments read and written back): one write per unit.
        LT_CHECK(off == 0 && n == numel(u), "internal: unit {}'s master remainders live in its NVMe image: write the "
                 "unit whole (write_master({}, {}, {}))", u, u, off, n);
        std::vector<uint16_t> lo(static_cast<size_t>(n));
        optim::split_tile(src, hi_ptr_[i], lo.data(), n);
        rem_opt_->write_remainders(int(u), lo.data());
      } else {
        optim::split_tile(src, hi_ptr_[i] + off, lo_[i].data() + off, n);
      }
      break;
    // The starting weights round to nearest (even): stochastic rounding is for updates.
    case MasterStorage::Bf16:
      for (int64_t k = 0; k < n; ++k) hi_ptr_[i][off + k] = f32_to_bf16(src[k]);
      break;
  }
  refresh_stream(u, off, n);
}

int64_t HostState::master_write_piece(int64_t u) const {
  return remainders_on_nvme(u) ? numel(u) : std::min(numel(u), kMasterWritePiece);
}

float* HostState::grad(int64_t u) {
  LT_CHECK(!grad16_ptr_[size_t(u)], "internal: unit {}'s host gradient is bf16 (gradient_dtype bf16 on the host): "
           "read it with grad_bf16", u);
  return grad_ptr_[size_t(u)];
}

optim::UnitBuffers HostState::update_buffers(int64_t u) {
  const size_t i = size_t(u);
  optim::UnitBuffers b;
  b.grad = grad_ptr_[i];
  b.grad_bf16 = grad16_ptr_[i];
  switch (storage_) {
    case MasterStorage::Aliased: b.master = f32_ptr_[i]; break;
    case MasterStorage::F32Copy:
      b.master = f32_ptr_[i];
      b.bf16 = static_cast<bf16_t*>(stream_ptr_[i]);
      break;
    case MasterStorage::Split:
      b.bf16 = hi_ptr_[i];
      b.lo = remainders_on_nvme(u) ? nullptr : lo_[i].data();
      break;
    case MasterStorage::Bf16: b.bf16 = hi_ptr_[i]; break;
  }
  return b;
}

void HostState::refresh_stream(int64_t u, int64_t off, int64_t n) {
  const size_t i = size_t(u);
  if (storage_ == MasterStorage::F32Copy) {
    auto* s = static_cast<bf16_t*>(stream_ptr_[i]);
    for (int64_t k = off; k < off + n; ++k) s[k] = f32_to_bf16(f32_ptr_[i][k]);
  } else if (stream_rebuilt()) {
    read_master(u, off, n, static_cast<float*>(stream_ptr_[i]) + off);
  }
}

void HostState::refresh_all_streams() {
  for (int64_t u = 0; u < units(); ++u) refresh_stream(u);
}

void HostState::zero_grads() {
  for (int64_t u = 0; u < units(); ++u) {
    if (grad_ptr_[size_t(u)]) std::memset(grad_ptr_[size_t(u)], 0, size_t(numel(u)) * 4);
    if (grad16_ptr_[size_t(u)]) std::memset(grad16_ptr_[size_t(u)], 0, size_t(numel(u)) * 2);
    sumsq_[size_t(u)] = 0;
  }
}

int64_t HostState::total_numel() const {
  int64_t s = 0;
  for (auto n : numel_) s += n;
  return s;
}

int64_t HostState::master_bytes() const {
  int64_t per = 0;
  switch (storage_) {
    case MasterStorage::Aliased: per = 4; break;
    case MasterStorage::F32Copy: per = 6; break;
    case MasterStorage::Split: per = stream_rebuilt() ? 8 : 4; break;
    case MasterStorage::Bf16: per = stream_rebuilt() ? 6 : 2; break;
  }
  int64_t on_nvme = 0;  // remainders in the optimizer's NVMe images: 2 B/param less here
  for (int64_t u = 0; u < units(); ++u)
    if (remainders_on_nvme(u)) on_nvme += numel(u);
  return per * total_numel() - 2 * on_nvme;
}

void HostState::attach_nvme_remainders(optim::CpuAdamW& opt) {
  const auto& specs = opt.units();
  LT_CHECK(int64_t(specs.size()) == units(), "internal: the optimizer has {} units, the host state {}", specs.size(),
           units());
  for (int64_t u = 0; u < units(); ++u) {
    if (!specs[size_t(u)].remainders_on_nvme || remainders_on_nvme(u)) continue;
    LT_CHECK(storage_ == MasterStorage::Split,
             "host state: unit {}'s master remainders are placed on NVMe, but the masters are stored as {} (only split "
             "fp32 masters have remainders)", u, master_storage_name(storage_));
    LT_CHECK(specs[size_t(u)].numel == numel(u), "internal: unit {} has {} elements in the optimizer, {} here", u,
             specs[size_t(u)].numel, numel(u));
    LT_CHECK(rem_opt_ == nullptr || rem_opt_ == &opt, "internal: host state remainders attached to two optimizers");
    if (!lo_[size_t(u)].empty()) opt.write_remainders(int(u), lo_[size_t(u)].data());  // else: zeros, as allocated
    std::vector<uint16_t>().swap(lo_[size_t(u)]);  // the DRAM array goes
    rem_opt_ = &opt;
    rem_nvme_.resize(size_t(units()), 0);
    rem_nvme_[size_t(u)] = 1;
  }
  for (int64_t u : opt_.nvme_remainder_units)
    LT_CHECK(storage_ != MasterStorage::Split || u >= units() || remainders_on_nvme(u),
             "internal: unit {} has no DRAM remainder array (nvme_remainder_units), but its optimizer keeps its "
             "remainders in DRAM (UnitSpec::remainders_on_nvme unset)", u);
}

int64_t HostState::grad_bytes() const {
  int64_t b = 0;
  for (int64_t u = 0; u < units(); ++u)
    b += (grad_ptr_[size_t(u)] ? 4 : grad16_ptr_[size_t(u)] ? 2 : 0) * numel(u);
  return b;
}

}  // namespace lt
