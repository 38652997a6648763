#include "exec/host_state.h"

#include <cstring>

#include "core/error.h"

namespace lt {

HostState::HostState(Backend& be) : stream_dtype_(be.dtypes().weight) {
  LT_CHECK(stream_dtype_ == DType::F32 || stream_dtype_ == DType::BF16,
           "host state: streaming dtype {} unsupported (expected F32 or BF16)", dtype_name(stream_dtype_));
  const auto& units = be.layout().units;
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t n = units[u].numel;
    numel_.push_back(n);
    if (aliased()) {
      master_pinned_.emplace_back(be, MemKind::Pinned, std::max<int64_t>(1, n * 4), "host.master");
      master_ptr_.push_back(master_pinned_.back().as<float>());
      std::memset(master_ptr_.back(), 0, size_t(n) * 4);
    } else {
      master_.emplace_back(size_t(n), 0.0f);
      master_ptr_.push_back(master_.back().data());
      stream_.emplace_back(be, MemKind::Pinned, std::max<int64_t>(1, n * 2), "host.stream_copy");
    }
    grad_.emplace_back(be, MemKind::Pinned, std::max<int64_t>(1, n * 4), "host.grad");
    sumsq_.push_back(0.0);
  }
  refresh_all_streams();
  zero_grads();
}

void HostState::refresh_stream(int64_t u) {
  if (aliased()) return;
  const float* m = master(u);
  const int64_t n = numel(u);
  auto* s = static_cast<bf16_t*>(stream(u));
  for (int64_t i = 0; i < n; ++i) s[i] = f32_to_bf16(m[i]);
}

void HostState::refresh_all_streams() {
  for (int64_t u = 0; u < units(); ++u) refresh_stream(u);
}

void HostState::zero_grads() {
  for (int64_t u = 0; u < units(); ++u) {
    std::memset(grad(u), 0, size_t(numel(u)) * 4);
    sumsq_[size_t(u)] = 0;
  }
}

int64_t HostState::total_numel() const {
  int64_t s = 0;
  for (auto n : numel_) s += n;
  return s;
}

}  // namespace lt
