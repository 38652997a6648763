// A unit whose optimizer update runs on the device: the embedding table when it is on the device anyway
// (tied to the LM head; HostStateOptions::embedding_update_device), and the first decoder layers
// (HostStateOptions::device_update_layers). Its master weights (the device copy the layers read, plus the split
// master's remainders) and its moments (fp32, or 8-bit codes with block scales, as the CPU optimizer keeps that
// tensor's) live in device memory, and once the step's norm is known the backend's AdamW step (Backend::adamw_step /
// adamw_step_q8: the CPU optimizer's arithmetic bit for bit, its scalar path for 8-bit moments) updates them on the
// compute lane, at the end of the step. That takes the unit off the CPU optimizer, whose whole update must otherwise
// run between the backward's end and the next forward (global-norm clipping): the first layers' forwards waited for
// their updates one after the other (Qwen2.5-3B: ~9 ms each against ~8 ms of forward), and a layer updated here
// also skips its weights' upload and its gradient's download.
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
  // itself; else bf16, the split master's high halves), or null: this object holds it ("optim.device.weights", a
  // layer's resident copy). grad: the device buffer the backward writes the unit's gradient into (fp32), or null:
  // this object holds one ("optim.device.grad"). With several micro-batches per step the executor sums each
  // micro-batch's gradient into accumulator() (Backend::grad_add, the host's accumulation bit for bit) instead.
  // The moments are allocated by the first load(), when the optimizer's formats are known ("optim.device.moments").
  DeviceUpdate(Backend& be, HostState& st, int64_t unit, void* weights, const float* grad, int micro_batches);
  int64_t unit() const { return unit_; }
  const void* weights() const { return weights_; }
  bool loaded() const { return loaded_; }  // the device copy is current (the host's is stale until store())
  // Where the backward writes the gradient with one micro-batch per step (the given buffer or this object's).
  float* grad_target() { return const_cast<float*>(grad_); }
  float* accumulator() { return acc_ ? acc_.as<float>() : nullptr; }
  // Device bytes this object holds once loaded (weights it owns, remainders, moments, gradient buffers).
  int64_t device_bytes() const;

  // Before the weights are read (Executor::set_update_hook): the device copy from the host (weights, remainders,
  // moments). Loads again when called again (a hook set anew).
  void load(UpdateHook& hook);
  // After the step's norm is known (its gradient final): the step's update, enqueued on the compute lane (the
  // executor synchronises once after every unit's, so that a step either returns with them done or fails before
  // them; a skipped step updates nothing). The planner models ~16 B moved per element with 8-bit moments (28 with fp32) at 3 TB/s; not timed on its own.
  void update(UpdateHook& hook);
  // The master and the moments back into the host state and the optimizer's arrays (synchronises the backend). A
  // no-op before the first load.
  void store();

 private:
  // One tensor's device moments: fp32 m, v or 8-bit codes mq, vq with block scales ms, vs (carved from moments_).
  struct Tensor {
    UpdateHook::DeviceTensor host;
    char* m = nullptr;   // fp32 m, or the 8-bit codes of m
    char* v = nullptr;
    float* ms = nullptr;  // 8-bit: block scales
    float* vs = nullptr;
  };
  void allocate_moments(const std::vector<UpdateHook::DeviceTensor>& host);
  // Copies between the host copies (master, remainders, the hook's moments) and the device, on `lane`.
  void transfer(bool to_device);

  Backend& be_;
  HostState& st_;
  int64_t unit_;
  void* weights_;
  const float* grad_;
  bool split_;  // bf16 weights + remainders (else the fp32 weights are the master)
  Buffer own_w_, own_g_, lo_, moments_, acc_;
  std::vector<Tensor> tensors_;
  bool loaded_ = false;
};

}  // namespace lt
