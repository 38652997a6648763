// A unit whose optimizer update runs on the device (issue 17; HostStateOptions::embedding_update_device): the
// embedding table, when it is on the device anyway (tied to the LM head). Its master weights (the
// device copy the layers read, plus the split master's remainders) and its fp32 moments live in device memory, and
// once the step's norm is known the backend's AdamW step (Backend::adamw_step, the CPU optimizer's arithmetic bit
// for bit) updates them on the compute lane, at the end of the step. That takes the table's update off the CPU optimizer,
// whose whole update must otherwise run between the backward's end and the next forward (global-norm clipping):
// Qwen2.5-3B's tied 311M-element table with fp32 moments was 53 ms of it, plus its gradient's D2H and the table's
// upload every step.
//
// The host state and the optimizer keep their copies (the checkpoint writes them, a resume fills them): load()
// fills the device from them before the first update, store() writes them back (Executor::flush_updates).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "exec/executor.h"
#include "exec/host_state.h"

namespace lt {

class DeviceUpdate {
 public:
  // weights: the unit's device copy the layers read (fp32 on an fp32-streaming backend, where it is the master
  // itself; else bf16, the split master's high halves); grad: the device buffer the backward writes its gradient
  // into (fp32), final there with one micro-batch per step; with several the executor sums them into accumulator()
  // (Backend::grad_add, the host's accumulation bit for bit). Allocates the remainders, the moments and that
  // accumulator ("optim.device.*").
  DeviceUpdate(Backend& be, HostState& st, int64_t unit, void* weights, const float* grad, int micro_batches);
  int64_t unit() const { return unit_; }
  float* accumulator() { return acc_ ? acc_.as<float>() : nullptr; }

  // Before the weights are read (Executor::set_update_hook): the device copy from the host (weights, remainders,
  // moments). Loads again when called again (a hook set anew).
  void load(UpdateHook& hook);
  // After the step's norm is known (its gradient final in grad): the step's update on the compute lane, waited for,
  // so that a step either returns with it done or fails before it (a skipped step updates nothing). ~2 ms of GPU time
  // at the end of the step, where the GPU would wait for the host anyway.
  void update(UpdateHook& hook);
  // The master and the moments back into the host state and the optimizer's arrays (synchronises the backend). A
  // no-op before the first load.
  void store(UpdateHook& hook);

 private:
  // Copies between the host copies (master, remainders, the hook's moments) and the device, on `lane`.
  void transfer(UpdateHook& hook, bool to_device);

  Backend& be_;
  HostState& st_;
  int64_t unit_;
  void* weights_;
  const float* grad_;
  bool split_;  // bf16 weights + remainders (else the fp32 weights are the master)
  Buffer lo_, m_, v_, acc_;
  std::vector<UpdateHook::DeviceTensor> tensors_;
  bool loaded_ = false;
};

}  // namespace lt
