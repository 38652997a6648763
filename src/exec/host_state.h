// Host-side model state (DESIGN §2), one entry per unit (0 = embedding, 1..L = layers, L+1 = head):
//  * master(u): fp32 master weights in host DRAM, the source of truth (UnitLayout flat layout);
//  * stream(u): the streaming copy in pinned memory, in the backend's weight dtype, uploaded to the device
//    each step. bf16 (CUDA): a separate buffer written by the optimizer pass. fp32 (CPU backend): the
//    master itself (then allocated in pinned memory), so no copy exists and nothing needs refreshing;
//  * grad(u):   fp32 gradient in pinned memory, summed over the micro-batches of a step;
//  * sumsq(u):  sum of squares of grad(u) for the step (set by the executor, for exact clipping).
// With tied embeddings the head has no LM matrix: its gradient lands in unit 0.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace lt {

class HostState {
 public:
  // Zero-initialised master weights.
  explicit HostState(Backend& be);
  int64_t units() const { return int64_t(numel_.size()); }
  int64_t numel(int64_t u) const { return numel_[size_t(u)]; }
  float* master(int64_t u) { return master_ptr_[size_t(u)]; }
  const float* master(int64_t u) const { return master_ptr_[size_t(u)]; }
  void* stream(int64_t u) { return aliased() ? static_cast<void*>(master(u)) : stream_[size_t(u)].data(); }
  bool aliased() const { return stream_dtype_ == DType::F32; }  // stream(u) is master(u)
  float* grad(int64_t u) { return grad_[size_t(u)].as<float>(); }
  double& sumsq(int64_t u) { return sumsq_[size_t(u)]; }
  DType stream_dtype() const { return stream_dtype_; }
  // Rewrites stream(u) from master(u) (rounding to bf16 when the backend streams bf16).
  void refresh_stream(int64_t u);
  void refresh_all_streams();
  void zero_grads();
  int64_t total_numel() const;

 private:
  DType stream_dtype_;
  std::vector<int64_t> numel_;
  std::vector<std::vector<float>> master_;  // bf16 streaming: plain host memory
  std::vector<Buffer> master_pinned_;       // fp32 streaming: pinned, doubles as the streaming copy
  std::vector<float*> master_ptr_;
  std::vector<Buffer> stream_, grad_;
  std::vector<double> sumsq_;
};

}  // namespace lt
