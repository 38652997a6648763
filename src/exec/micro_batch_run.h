// One micro-batch of a step: the windows of the plan in order, each issuing its transfers first, then
// its compute (docs/executor.md). Internal to the executor: Executor::train_step / eval_loss drive it;
// micro_batch_run.cpp holds the phases, the weight loads and the gradients, ckpt_traffic.cpp the
// checkpoints' trips through the CPU and NVMe tiers.
#pragma once
#include <future>
#include <vector>

#include "exec/executor_impl.h"

namespace lt {

// A byte range of a padded boundary.
struct CkptRange {
  int64_t off = 0, len = 0;
};

// Byte ranges of a share list over a padded boundary of `pad` bytes (rounded to kIoAlign).
std::vector<CkptRange> share_ranges(const std::vector<ExecPlan::Share>& sh, int64_t pad);

// State of one boundary's trip through the CPU/NVMe tiers during one micro-batch.
struct CkptTrip {
  std::vector<CkptRange> d2h_r, wr_r, rd_r, h2d_r;
  size_t d2h_next = 0, wr_next = 0, rd_next = 0, h2d_next = 0;
  std::vector<Event> d2h_ev;                  // per issued d2h share
  std::vector<std::shared_future<void>> wr_f, rd_f;
  Event h2d_last;
  int wslot = -1, rslot = -1;
  bool released = false;  // forward device buffer returned to the pool
};

class MicroBatchRun {
 public:
  MicroBatchRun(Executor::Impl& im, const MicroBatch& mb, int32_t mb_index, int32_t n_mb, float loss_scale, bool train,
                UpdateHook* hook, std::vector<char>& waited, double& update_wait)
      : I(im), be(im.be), P(im.P), mb_(mb), mbi_(mb_index), nmb_(n_mb), scale_(loss_scale), train_(train),
        hook_(hook), waited_(waited), update_wait_(update_wait) {
    count_segment_runs();
  }

  void run();
  // Backend::prepare_geometry for each chunk's geometry (Executor::prepare).
  void prepare();
  // After synchronize(): every host-side job of this micro-batch finished; rethrows their errors.
  void finish();
  double t_forward_end = 0;

 private:
  Executor::Impl& I;
  Backend& be;
  const ExecPlan& P;
  const MicroBatch& mb_;
  int32_t mbi_, nmb_;
  float scale_;
  bool train_;
  UpdateHook* hook_;
  std::vector<char>& waited_;
  double& update_wait_;

  const RingSchedule* rs_ = nullptr;
  int64_t use_ = 0, next_load_ = 0;
  std::vector<Event> use_done_, load_ready_;
  std::vector<int> xbuf_;      // device buffer holding boundary i (forward / block)
  std::vector<Event> produced_;
  std::vector<CkptTrip> trip_;
  std::vector<int> wslot_owner_, rslot_owner_;  // boundary holding each NVMe staging slot, -1 = free
  std::vector<Event> rslot_free_ev_;
  Event emb_ready_, head_ready_, gslot_free_[2];
  int gslot_next_ = 0;
  int slab_next_ = 0;                       // host gradients: the D2H slab the next unit uses
  std::shared_future<void> slab_busy_[2];   // the sink thread's accumulation out of each slab
  Event last_grad_d2h_;
  int dy_ = -1;  // gradient at the current boundary
  int32_t cur_w_ = 0;

  void* X(int id) const { return I.pool->ptr(id); }
  char* row(void* base, int64_t r) const { return static_cast<char*>(base) + r * I.c.hidden * int64_t(I.act_sz); }
  DevGeometry geom(int64_t s0, int64_t ns) const;
  // Per sample: the runs of equal segment ids and the longest (DevGeometry::runs/longest_run), counted once.
  void count_segment_runs();
  std::vector<int64_t> seg_runs_, seg_longest_;
  OpLabel lab(const char* what, int32_t index) const { return OpLabel{what, cur_w_, index}; }
  // f(first row, geometry) for each chunk of the micro-batch (ExecPlan::chunk_samples samples).
  template <typename F>
  void for_chunks(F&& f) const {
    for (int64_t s0 = 0; s0 < P.batch; s0 += I.chunk) f(s0 * P.seq, geom(s0, std::min(I.chunk, P.batch - s0)));
  }

  // ---- the phases of run()
  void begin();
  void stage_inputs();
  void upload_emb();
  void upload_head();
  void embed_inputs();
  void forward_layer(int64_t j);
  void head();
  const char* lm_weights() const;  // the LM head's matrix: lm_head.weight, or the embedding when tied
  void head_with_grads();
  void head_by_slices(const char* lm_w);  // training with Executor::Impl::head_slices (exec/head_grads.cpp)
  int32_t backward_block(int64_t s, int64_t e, int32_t w);
  void enter_block_window(int64_t s, int32_t w, bool& reloaded);
  void backward_layer(int64_t j);
  void finish_embedding(int32_t w);
  void embed_backward(const void* dx);  // the embedding's gradient on the device (exec/head_grads.cpp)

  void wait_update(int64_t unit, bool first_only = false);
  bool lookup_rows_first() const;  // this micro-batch's tokens are all among the embedding rows updated first

  // ---- weights
  // Issues the loads of uses <= upto whose slot is free of enqueued compute. Called with the current
  // use before its compute (mandatory load), and after enqueuing it with up to ring-1 uses ahead
  // (prefetch): waiting there for a layer's optimizer update never delays already-enqueued compute.
  void issue_loads(int64_t upto);
  const void* weights_for_use();
  // A layer updated on the device (DeviceUpdate, loaded): its weights there, which the ring does not load; else null.
  const void* resident_weights(int64_t layer) const;
  void end_use();

  // ---- checkpoint traffic
  void* tier_host_ptr(int64_t i, bool write_side);
  int acquire_wslot(int64_t i);
  int acquire_rslot(int64_t i);

  void issue_d2h(int64_t i);
  static int64_t issued_bytes(const std::vector<CkptRange>& r, size_t next);
  void issue_write(int64_t i);
  void issue_read(int64_t i);
  void issue_h2d(int64_t i);

  bool offloaded(int64_t i) const {
    return i < I.L && (P.tier[size_t(i)] == CkptTier::Cpu || P.tier[size_t(i)] == CkptTier::Nvme);
  }

  // Transfers assigned to window w (only boundaries already produced).
  void issue_window_transfers(int32_t w);
  // After window w's compute: return forward buffers of offloaded boundaries whose D2H is all issued.
  void release_offloaded(int32_t w, const Event& win_end);

  // ---- gradients
  // Zeroes the buffer the backward accumulates unit's gradient into; a held buffer first waits until the
  // previous step's gradient left it.
  void zero_grad(int64_t unit, void* dst, int64_t bytes, bool held);
  // Unit's gradient of this micro-batch is complete in dgrad: offloaded to the host or, held on the
  // device, its sum of squares taken (held_direct) or added into the unit's held accumulator (fp32 or
  // bf16; the sum of squares of the stored values with the last micro-batch's addition, as the host does).
  void grad_done(int64_t unit, void* dgrad, int64_t numel);
  // D2H of a unit's device gradient to the host; accumulation/conversion on the sink thread.
  void offload_grad(int64_t unit, void* dgrad, int64_t numel);
  // The same for gradients on the host in bf16: rounded on the device piece by piece, copied down in bf16.
  void offload_grad_bf16(int64_t unit, const void* dgrad, int64_t numel);
};

}  // namespace lt
