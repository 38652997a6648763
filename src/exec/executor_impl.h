// Executor internals, shared by executor.cpp (the schedule) and executor_report.cpp (stats, trace).
#pragma once
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "exec/act_pool.h"
#include "exec/device_update.h"
#include "exec/executor.h"
#include "exec/grad_stream.h"
#include "exec/host_worker.h"
#include "exec/nvme_store.h"
#include "exec/weight_ring.h"

namespace lt {

// Tracks beyond the backend's lanes, for traces.
// Label of the host spans during which the executor waits for a unit's optimizer update.
inline constexpr const char* kOptimizerWaitLabel = "optimizer.wait";
// Labels of the embedding's device ops ("embed.fwd", "embed.bwd") start with this: window_stats sums them apart.
inline constexpr std::string_view kEmbedLabelPrefix = "embed.";

enum ExtraTrack : int { kTrackNvmeRead = kNumLanes, kTrackNvmeWrite, kTrackHost, kTrackWindows, kNumTracks };

struct TraceSpan {
  int track = 0;
  OpLabel label;
  int64_t bytes = 0;
  double t0 = 0, t1 = 0;
  int32_t micro_batch = 0;
};

// The backend's workspace, held at the plan's size (plan_workspace_bytes) from hold() to this one's end.
class WorkspaceHold {
 public:
  WorkspaceHold() = default;
  ~WorkspaceHold();
  WorkspaceHold(const WorkspaceHold&) = delete;
  WorkspaceHold& operator=(const WorkspaceHold&) = delete;
  void hold(Backend& be, int64_t bytes);

 private:
  Backend* be_ = nullptr;
};

struct Executor::Impl {
  Impl(Executor& ex);
  ~Impl();

  Executor& ex;
  Backend& be;
  const ExecPlan& P;
  HostState& st;
  ModelConfig c;
  int64_t L = 0, T = 0, A = 0, Apad = 0, chunk = 0;
  size_t act_sz = 4, w_sz = 4, g_sz = 4;
  std::vector<WindowRef> wins;
  std::vector<int64_t> ck;
  std::vector<int32_t> win_bwd, win_rec;  // window of B_j / R_j (-1 if none)
  std::vector<ExecPlan::Traffic> traffic;  // effective, per boundary
  std::vector<int64_t> block_end;          // for a checkpoint s: the e of its block
  RingSchedule ring_sched, eval_sched;
  bool emb_on_device = true;  // embedding_on_device(): device buffers, lookup and backward on the device
  // Gradients held on the device (GradHome::Device): the held buffers and their streaming; null with
  // host gradients. held_direct: the backward writes into the held buffers (ExecOptions::micro_batches
  // == 1), else each micro-batch's gradient is added into fp32 held accumulators.
  std::unique_ptr<GradStream> dgrads;
  bool held_direct = false;
  // Units updated on the device (HostStateOptions::updated_on_device), in unit order: the embedding's gradient stays
  // in emb_grad (summed there over the micro-batches) and the table is updated in place instead of uploaded; a
  // layer's weights stay in the update's buffer (the ring loads nothing for it) and its gradient in the update's.
  std::vector<std::unique_ptr<DeviceUpdate>> dev_updates;
  std::vector<DeviceUpdate*> dev_update_of;  // per unit, or null
  DeviceUpdate* device_update(int64_t unit) const {
    return dev_update_of.empty() ? nullptr : dev_update_of[size_t(unit)];
  }
  bool updated_on_device(int64_t unit) const { return device_update(unit) != nullptr; }
  void* emb_grad = nullptr;   // where the backward writes the embedding's / head's gradient: emb_g /
  void* head_grad = nullptr;  // head_g, or their held buffers when held_direct
  // HostStateOptions::head_grad_slices: the head's gradient by vocabulary slices into its held buffer (the final
  // norm's in head_norm_g, one slice of the LM weight's in head_slice_g: head_slice_rows x hidden, fp32; each row's
  // log-sum-exp in head_lse) and the embedding's straight into its held buffer: no emb_g / head_g.
  bool head_slices = false;
  int64_t head_slice_rows = 0;
  Buffer head_norm_g, head_slice_g, head_lse;

  // device
  WorkspaceHold workspace;  // released when the executor ends, after its work is done (~Impl)
  std::vector<Buffer> ring;
  Buffer emb_w, head_w, emb_g, head_g;
  Buffer gslot[2];  // layer gradients of one micro-batch (not allocated when held_direct)
  // Gradients on the host in bf16 (HostStateOptions::host_bf16_grads): each unit's gradient is rounded into these two
  // buffers of the largest layer, piece by piece, and copied down from them; g16_free[k]: the copy that last read
  // g16[k].
  bool host_bf16 = false;
  Buffer g16[2];
  Event g16_free[2];
  int g16_next = 0;
  Buffer d_ids, d_tgt, d_pos, d_seg, d_scal;  // d_scal: loss_sum, n_tokens, sumsq[units]
  std::unique_ptr<ActPool> pool;
  // Kept internals (ExecPlan::kept_layers): per layer (empty for the others), one region of keep_chunk[j]
  // bytes per chunk of samples.
  std::vector<Buffer> keep;
  std::vector<int64_t> keep_chunk;
  void* keep_for(int64_t j, int64_t row0) const;  // layer j's region of the chunk starting at token row row0, or null
  // pinned
  Buffer p_ids, p_tgt, p_pos, p_seg, p_scal, p_x0, p_dx0;
  std::vector<Buffer> cpu_ckpt;  // per boundary (cpu tier only)
  std::vector<Buffer> wstage, rstage;
  std::vector<Buffer> gslab;  // grad staging for accumulation / dtype conversion (lazy)
  std::unique_ptr<NvmeStore> store;
  std::unique_ptr<HostWorker> nvme_worker, sink_worker;

  // trace of the last step
  std::mutex trace_mu;
  std::vector<TraceSpan> trace;
  double trace_t0 = 0;
  std::vector<std::vector<WindowStats>> trace_windows;  // per micro-batch of the last step

  void allocate();
  void allocate_grads();
  void allocate_kept();
  void recover_from_failure();
  double report_gradients(int32_t nmb, UpdateHook* hook);
  // Sums of squares of units whose final gradient is formed on the host (several micro-batches, or
  // the host embedding), computed in the pass that forms it.
  std::vector<double> host_sumsq;
  // track_rows: the hook leaves the host gradients alone, so the rows the last assignment wrote (emb_rows) are
  // the only nonzero ones, and the next assignment zeroes just those.
  void host_embedding_backward(const int32_t* ids, bool assign, bool last, bool track_rows);
  // Embedding rows the optimizer runs first (Executor::set_next_step_ids): those hinted for the update this step
  // ends with (pending), and those of the update this step's lookup reads (active); per row 1/0, or empty.
  std::vector<char> first_rows_pending, first_rows_active;
  void hint_next_rows(UpdateHook* hook, const std::vector<int32_t>& next_ids);
  std::vector<int32_t> emb_rows;  // ascending; valid when emb_rows_valid
  bool emb_rows_valid = false;
  void add_span(int track, OpLabel l, int64_t bytes, double t0, double t1, int32_t mb);
  void collect_backend_spans(int32_t mb);
  // Measured per-window figures of micro-batch mb from the collected spans.
  std::vector<WindowStats> window_stats(int32_t mb, double t_mb0) const;
};

}  // namespace lt
