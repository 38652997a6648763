// Layer-streaming executor: runs one training step (forward, loss, backward, gradient offload) of an
// ExecPlan on a Backend, with the model state in host memory. The trainer owns an Executor.
//
//   lt::CpuBackend be(cfg);                       // or the CUDA backend
//   lt::HostState st(be);                         // fp32 master, streaming copy, gradients per unit
//   ... write st.master(u) for every unit, then st.refresh_all_streams();
//   lt::ExecPlan plan = lt::exec_plan_from(planner_plan, cfg);   // exec/plan_adapter.h
//   lt::Executor ex(cfg, be, plan, st, opts);     // allocates everything; throws "does not fit: ..."
//   ex.set_update_hook(&hook);                    // optional: per-unit CPU optimizer (exec/optim_hook.h)
//   lt::StepResult r = ex.train_step(micro_batches);   // each micro-batch is plan.batch x plan.seq
//   ex.write_trace("step.json");                  // --trace: Chrome/Perfetto trace of that step
//
// Units (model/param_layout.h): 0 = embedding, 1..L = decoder layers, L+1 = head.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "exec/exec_plan.h"
#include "exec/host_state.h"
#include "exec/nvme_store.h"

namespace lt {

// One micro-batch in host memory; all arrays [plan.batch * plan.seq], sample-major.
struct MicroBatch {
  const int32_t* ids = nullptr;
  const int32_t* targets = nullptr;    // already shifted (cpu::shift_labels), -100 = ignored
  const int32_t* positions = nullptr;  // nullptr: 0..seq-1 per sample
  const int32_t* segments = nullptr;   // nullptr: one segment per sample
};

// Per-unit optimizer hook (src/exec/optim_hook.h adapts optim::CpuAdamW). The executor guarantees:
// grad_ready(u, sumsq) is called once per step, after unit u's gradient for the whole step is final in
// HostState::grad(u) (sumsq = its sum of squares, for exact global-norm clipping); the hook may then
// update master(u) and the streaming copy stream(u) asynchronously. Before the next step reads unit u's
// weights it calls wait(u). Nothing is called for a step that failed.
//
// Gradients held on the device (HostState option GradHome::Device): at the end of the step the executor
// calls grad_norm_part(u, sumsq) for every such unit (the norm is then known), and later, as each
// gradient reaches a pinned staging buffer, grad_staged(u, grad, dtype) — from a worker thread, possibly
// during the next train_step or eval_loss, and always before the executor calls wait(u); that buffer
// stays untouched until wait(u) returned. wait(u) may be called more than once per step (it must be
// idempotent). Units with a host gradient still get grad_ready.
class UpdateHook {
 public:
  virtual ~UpdateHook() = default;
  virtual void grad_ready(int64_t unit, double sumsq) = 0;
  virtual void grad_norm_part(int64_t unit, double sumsq);
  virtual void grad_staged(int64_t unit, const void* grad, DType dtype);
  virtual void wait(int64_t unit) = 0;  // blocks until unit's update (if any was submitted) finished
  // Whether it writes the host gradients it is given (data parallelism: scaled and reduce-scattered in place).
  // When it does not, the executor keeps track of which rows of a host-computed embedding gradient are nonzero
  // and zeroes only those the next step (instead of the whole table).
  virtual bool rewrites_host_gradients() const { return false; }
  // A hint for unit's next update: run these element ranges of it first (the next step's embedding rows, which
  // its lookup needs before anything else). wait_first(unit) blocks until they are done (wait() without a hint).
  virtual void prioritize(int64_t unit, std::vector<std::pair<int64_t, int64_t>> ranges) {
    (void)unit, (void)ranges;
  }
  virtual void wait_first(int64_t unit) { wait(unit); }

  // A unit whose update runs on the device (exec/device_update.h; the executor reports it with grad_norm_part, never
  // grad_ready). Its tensors (element offset and count in the unit) with the host arrays of their moments (fp32 m, v;
  // or 8-bit codes mq, vq with one absmax scale per optim::kQ8Block elements in ms, vs), which the device copy is
  // loaded from and written back to; and, once the step's norm is known, each tensor's constants (false: the step was
  // skipped, no update). The default: no unit can be updated on the device.
  struct DeviceTensor {
    int64_t offset = 0, numel = 0;
    float* m = nullptr;
    float* v = nullptr;
    uint8_t* mq = nullptr;
    uint8_t* vq = nullptr;
    float* ms = nullptr;
    float* vs = nullptr;
    bool q8() const { return mq != nullptr; }
  };
  virtual std::vector<DeviceTensor> device_tensors(int64_t unit);
  virtual bool device_step(int64_t unit, std::vector<AdamWStepScalars>& per_tensor);
};

struct ExecOptions {
  std::filesystem::path nvme_dir;          // required when the plan has NVMe-tier boundaries
  std::shared_ptr<IoLayer> io;             // file I/O for the NVMe tier; nullptr = default (O_DIRECT, io_uring)
  int64_t nvme_budget = -1;                // bytes the NVMe tier may use; < 0 = unlimited
  bool timing = true;                      // collect spans and per-window figures
  // Micro-batches per step the executor is sized for. Matters only with gradients held on the device
  // (GradHome::Device): 1 = the backward writes into the held buffers (train_step then takes one
  // micro-batch); > 1 = each micro-batch's gradient is added into fp32 held accumulators on the device
  // (Backend::grad_add), beside per-micro-batch buffers as with host gradients (any count works).
  int32_t micro_batches = 1;
  // HostStateOptions::head_grad_slices: the vocabulary rows of one slice; 0 = head_grad_slice_rows (256 MiB of fp32).
  // Tests set fewer, so that a small vocabulary still splits.
  int64_t head_slice_rows = 0;
};

struct WindowStats {
  int32_t index = 0;
  WindowRef ref{WindowKind::Forward, 0};
  double t_begin = 0, t_end = 0;  // seconds from the step start; [end of previous window's compute, end of this one's]
  WindowFigures measured;         // of the LAST micro-batch
  WindowFigures predicted;        // from the plan (zeros if it has none)
};

// Between the micro-batches of a step (gradient accumulation): whether to stop the step there, and what to do just
// before its last micro-batch. The trainer begins the optimizer's step in before_last, so that a step stopped
// earlier has not told the optimizer anything (its master weights and moments are the previous step's).
struct StepCallbacks {
  std::function<bool(int64_t next)> stop;  // polled before each micro-batch `next` after the first
  std::function<void()> before_last;  // runs once, before the last micro-batch (with one micro-batch: first)
};

// train_step stopped by StepCallbacks::stop before micro-batch `next` of `total` (no update of this step ran).
struct StepInterrupted : std::runtime_error {
  int64_t next = 0, total = 0;
  StepInterrupted(int64_t next_mb, int64_t total_mb)
      : std::runtime_error("step stopped between micro-batches"), next(next_mb), total(total_mb) {}
};

struct StepResult {
  double loss = 0;          // sum of token losses / n_tokens, over all micro-batches
  int64_t n_tokens = 0;     // non-ignored targets of the step
  int64_t rows = 0;         // all tokens (batch * seq * micro-batches), padding included
  double grad_norm = 0;     // global L2 norm of the step's gradient (before clipping; from the sumsq partials)
  double step_s = 0;        // wall time of train_step
  double forward_s = 0, backward_s = 0;  // wall time of the (last micro-batch's) forward incl. head / backward
  double update_wait_s = 0;  // time forward waited for the previous step's optimizer updates
  double exposed_s = 0;      // sum over windows and micro-batches of measured exposed time
  double exposed_optimizer_s = 0;  // the part of exposed_s while the host waited for optimizer updates
  WindowFigures totals;      // measured lane busy times and exposed time, summed over windows and micro-batches
  double predicted_exposed_s = 0;
  std::vector<WindowStats> windows;
  int64_t peak_device = 0, peak_pinned = 0;
  // Activation buffers allocated beyond the planned count (count_act_buffers): non-zero only when the
  // NVMe staging buffers forced a reload earlier than its window. The planner's HBM figure was exceeded.
  int64_t act_buffers_over_plan = 0;
};

// Device buffers of one boundary activation (batch*seq*hidden in the act dtype) that the executor
// allocates for a plan: the maximum over windows of live boundaries, their gradients and reloads
// (docs/executor.md, "Device memory"). The planner's HBM model should count the same.
int64_t count_act_buffers(const ExecPlan& p);

// Whether the embedding has device buffers and its lookup and backward run on the device: when the
// plan keeps it resident, or when the weights are tied (the LM head needs its device copy anyway:
// uploading it once per step replaces a host gather and a host scatter-add of the whole table).
// Otherwise (untied, not resident) both run on the host and only boundary 0 crosses PCIe.
bool embedding_on_device(const ModelConfig& c, const ExecPlan& p);

// Units whose gradient the executor forms on the host whatever GradHome says (the embedding when it is
// not on the device): with GradHome::Device, HostStateOptions::host_grad_units must list them.
std::vector<int64_t> host_grad_units(const ModelConfig& c, const ExecPlan& p);

// Bytes the executor allocates for a plan (what its constructor reserves), so that a planner or a
// `--batch max` search can use the executor's own numbers. device includes the backend workspace
// given; pinned excludes HostState (master/stream/grads) and the gradient slabs that only several
// micro-batches or bf16 gradients need with host gradients (2 x the largest unit in the grad dtype).
// With gradients held on the device (grads, micro_batches as ExecOptions::micro_batches) device
// includes the held gradients of every device-computed unit ("grads.held": in the grad dtype for one
// micro-batch, replacing the two layer gradient buffers; fp32 accumulators beside them for several;
// bf16 held gradients (held_dtype) are always accumulators beside the per-micro-batch buffers)
// and pinned the staging ring ("grads.staging": core/model_state.h grad_ring_elems).
struct ExecMemory {
  int64_t device = 0, pinned = 0, nvme = 0;
};
// How a run holds its weight gradients, as executor_memory sizes them: where (HostStateOptions::grads), the
// micro-batches (ExecOptions::micro_batches), their dtype (held, or host bf16), the held gradients' staging ring
// (StatePlacement::grad_ring_depth, pinned) and the head's gradient by slices (StatePlacement::head_grad_slices).
struct GradSizing {
  GradHome home = GradHome::Host;
  int32_t micro_batches = 1;
  GradDType dtype = GradDType::F32;
  int ring_depth = kGradRingDepth;
  bool head_slices = false;
};
// kept_bytes: the kept layers' buffers (kept_internals_bytes), device.
ExecMemory executor_memory(const ModelConfig& c, const ExecPlan& p, BackendDTypes dt, int64_t workspace_bytes,
                           const GradSizing& grads = {}, int64_t kept_bytes = 0);
// The backend workspace the executor holds for a plan (Backend::hold_workspace, before its other device buffers):
// the largest over every call the plan makes (layer_workspace_bytes at each chunk size, embed_workspace_bytes over
// the micro-batch). executor_memory's workspace_bytes.
int64_t plan_workspace_bytes(const Backend& be, const ExecPlan& p);
// Device bytes of the plan's kept layers on this backend (ExecPlan::kept_layers; one region per chunk of samples):
// layer j's entry, 0 for a layer that keeps nothing. The executor allocates exactly these ("keep.layer<j>").
std::vector<int64_t> kept_internals_bytes(const Backend& be, const ExecPlan& p);

class Executor {
 public:
  Executor(const ModelConfig& c, Backend& be, const ExecPlan& plan, HostState& state, ExecOptions opts = {});
  // Waits for all work, removes its NVMe files and directory, frees its allocations. With gradients held
  // on the device it first streams what is left (flush_updates) and waits for the updates reading its
  // staging buffers, so the update hook must outlive the executor.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // With the embedding updated on the device, its device copy (table, remainders, moments) is loaded from the host
  // state and the hook here, before the first step (once; ~0.4 s for Qwen2.5-3B's table from pageable memory).
  void set_update_hook(UpdateHook* hook);
  // The token ids of the next train_step (all its micro-batches), before this one: with the embedding looked up on
  // the host, this step's embedding update runs those rows first (UpdateHook::prioritize), and the next step's
  // lookup waits only for them (measured: the whole table's update was ~95 ms of Qwen2.5-7B's step, exposed).
  void set_next_step_ids(std::vector<int32_t> ids) { next_ids_ = std::move(ids); }
  bool wants_next_step_ids() const;  // the embedding is looked up on the host and an update hook is set

  // Forward + loss + backward of every micro-batch (gradient accumulation; the loss is normalised by
  // the non-ignored tokens of the whole step), then the global norm and UpdateHook::grad_ready per unit
  // (gradients held on the device: grad_norm_part, then they stream to the hook as the next forward
  // waits for the updates; see flush_updates).
  // On any error (I/O, memory, backend) throws lt::Error after cleaning up: the hook is not called for
  // this step, so master weights and optimizer state are untouched (host gradients are undefined), this
  // step's NVMe files are removed, and the executor stays usable. The previous step's device-held
  // gradients are not lost: those not yet handed over stream again in the next step or flush_updates.
  // loss_tokens > 0: the gradients are normalised by this count instead (a data-parallel rank's share of
  // a global batch: that batch's loss tokens, so that the ranks' gradients sum to one process's); the
  // result's loss and n_tokens stay this call's own.
  // cb: the stop check between micro-batches (StepInterrupted, after the same clean-up as an error) and the hook
  // before the last one.
  StepResult train_step(const std::vector<MicroBatch>& micro_batches, int64_t loss_tokens = 0,
                        const StepCallbacks& cb = {});
  // Mean loss over non-ignored targets of one micro-batch (forward only, no gradients, no update). Its
  // forward waits for each unit's update like a step's (streaming device-held gradients as it goes).
  double eval_loss(const MicroBatch& mb, int64_t* n_tokens = nullptr);
  // Gradients held on the device: issues the copy of every gradient not yet streamed (waiting for
  // staging slots' updates as needed) and returns once each was handed to the hook, so that the hook's
  // wait(u) / AdamWHook::wait_all covers the whole step. Call it before waiting for all updates (a
  // checkpoint save, the end of training). With the embedding updated on the device
  // (HostStateOptions::embedding_update_device) its pending update runs and its master and moments are written back
  // to the host state and the hook's arrays. Otherwise a no-op with host gradients.
  void flush_updates();

  // Before the first train_step (host side): builds what the backend would build at these micro-batches' shapes
  // (Backend::prepare_geometry: cuDNN's attention graphs for their packed rows), so that it does not land in a
  // timed step. Optional; a later batch of a new shape still builds in its step.
  void prepare(const std::vector<MicroBatch>& mbs);

  // Chrome/Perfetto trace (one track per lane, plus NVMe and host tracks) of the last train_step.
  void write_trace(const std::filesystem::path& path) const;
  // Table of named allocations (backend memory tracker) with the plan's tier budgets.
  std::string memory_table() const;
  // Per-window measured vs predicted table of the last step.
  std::string window_table(const StepResult& r) const;

  const ExecPlan& plan() const { return plan_; }
  HostState& state() { return state_; }
  int64_t nvme_files_live() const;  // files currently present in the executor's NVMe directory

  struct Impl;

 private:
  ModelConfig cfg_;
  Backend& be_;
  ExecPlan plan_;
  HostState& state_;
  ExecOptions opts_;
  UpdateHook* hook_ = nullptr;
  std::vector<int32_t> next_ids_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lt
