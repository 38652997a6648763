// CPU AdamW for the layer-streaming trainer: fp32 or 8-bit blockwise moments per tensor, exact
// global-norm gradient clipping fused into the update, and an asynchronous per-unit updater.
//
// One optimizer step, as the executor drives it (units = model/param_layout.h units):
//
//   opt.begin_step(lr);                         // any time after the previous step's norm is known
//   ... backward produces unit u's final gradient (any order) ...
//   opt.add_grad_sumsq(u, sumsq_u);             // partial sum of squares of u's gradient, computed where
//                                               // the gradient is produced (GPU, or grad_sumsq() on CPU)
//   opt.submit(u, {master, grad, bf16_copy});   // queued; runs once the global norm is known
//   ... when the last unit's partial sum arrives, the clip factor is fixed and the queued updates
//       start on the worker pool, lowest unit index first (the order the next forward needs) ...
//   opt.wait(u);                                // next forward of unit u: blocks only for u's update
//
// The update makes ONE pass over memory per tensor: it reads grad, master, m, v and writes master, m, v
// and the bf16 streaming copy (round to nearest even). Buffers passed to submit() must stay valid and
// untouched by the caller until wait(u) returns. A non-finite global norm skips the whole step (state,
// masters and bf16 copies untouched; counted, StepInfo::skipped; the caller reports it: the trainer names
// where the non-finite value came from) or throws, per AdamWConfig::on_nonfinite.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "optim/adamw_kernels.h"
#include "optim/aligned_buffer.h"

namespace lt {
class IoLayer;
}

namespace lt::optim {

class ThreadPool;
class NvmeMoments;
struct MomentArrays;

// How the master weights the update reads and writes are stored (core/model_state.h, split_master.h).
//   F32     fp32 array (`master`); a bf16 streaming copy is written to `bf16` when given.
//   Split   the exact fp32 master as bf16 high half (`bf16`, also the streaming copy) + 16-bit
//           remainder (`lo`); rebuilt, updated and split again per tile, bit-identical to F32's master.
//   Bf16Sr  bf16 master (`bf16`), rounded stochastically after the update (AdamWConfig::sr_seed).
// (enum class MasterFormat: adamw_kernels.h.) The AVX-512 path (8-bit: with VBMI) converts inside the
// kernels instead of per tile (adamw_*_fused), with the same bits.
const char* master_format_name(MasterFormat f);  // "fp32", "split", "bf16-sr"

// Optimizer-state format of one tensor.
enum class StateFormat : uint8_t { F32 = 0, Q8 = 1 };
const char* state_format_name(StateFormat f);  // "fp32", "8bit"

// Bytes of optimizer state (m and v, incl. 8-bit block scales) for a tensor of numel elements.
int64_t state_bytes(int64_t numel, StateFormat f);

struct TensorSpec {
  std::string name;             // for messages and the state file
  int64_t offset = 0;           // element offset in the unit's flat buffer
  int64_t numel = 0;
  int group = 0;                // index into AdamWConfig::groups
  StateFormat format = StateFormat::F32;
};

struct UnitSpec {
  std::vector<TensorSpec> tensors;
  int64_t numel = 0;            // flat buffer size (elements); tensors must lie inside it
  // The unit's moments live in a file under AdamWConfig::nvme_dir, staged through a small ring of DRAM
  // slots for its update (optim/nvme_moments.h); not part of the state file's layout.
  bool moments_on_nvme = false;
  // MasterFormat::Split and moments_on_nvme only: the unit's 16-bit master remainders are part of its NVMe image
  // too (2 B/param more in the file and the staging slot, none in DRAM): the update reads and writes them in the
  // staging slot, so submit() takes UnitBuffers::lo = nullptr for the unit; read_remainders()/write_remainders()
  // move them between the image and the caller (checkpoints, the fp32 master rebuilt). Never written, they are
  // zero (the master equals its bf16 high half).
  bool remainders_on_nvme = false;
};

// Per-group hyperparameters (PyTorch param groups). The effective lr of a group is lr * lr_scale.
struct GroupHyper {
  float lr_scale = 1.0f;
  float weight_decay = 0.0f;
};

enum class NonFinitePolicy { Skip, Stop };

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  // Default groups: 0 = decayed (matrices, embeddings), 1 = not decayed (norms, biases).
  std::vector<GroupHyper> groups = {{1.0f, 0.01f}, {1.0f, 0.0f}};
  float max_grad_norm = 1.0f;   // <= 0: no clipping (the norm is still computed, for the non-finite check)
  NonFinitePolicy on_nonfinite = NonFinitePolicy::Skip;
  int threads = 0;              // worker threads; 0 = hardware concurrency
  int64_t chunk_elems = 1 << 18;  // work item size; large tensors are split across threads
  Isa isa = Isa::Auto;          // kernel path (Auto = best the CPU supports; LT_OPTIM_ISA env overrides Auto)
  MasterFormat master = MasterFormat::F32;
  uint64_t sr_seed = 0;         // Bf16Sr: the rounding bits are a function of (seed, step, unit, element)
  bool fused_masters = true;    // false: always the tile path (tests and benchmarks compare the two)
  // NVMe-resident moments (UnitSpec::moments_on_nvme): files in a private directory under nvme_dir;
  // nvme_io nullptr = default_io() (O_DIRECT through io_uring); nvme_slots DRAM staging slots of the
  // largest such unit's moment bytes (2: read/update and write overlap; 3: read, update, write at once).
  std::filesystem::path nvme_dir;
  std::shared_ptr<IoLayer> nvme_io;
  int nvme_slots = 3;
};

// Where the moments are: DRAM arrays, DRAM staging slots of the NVMe tier, NVMe files (bytes).
struct MomentHomes {
  int64_t dram = 0, staging = 0, nvme = 0;
  int64_t remainders = 0;  // of nvme: master remainders in the images (UnitSpec::remainders_on_nvme)
};

// What the step decided once the global norm was known.
struct StepInfo {
  int64_t step = 0;             // AdamW step count t after this step (unchanged if skipped)
  double grad_norm = 0;         // total L2 norm of all gradients (before clipping)
  float clip_coef = 1.0f;       // factor applied to the gradients (1 when not clipping)
  bool skipped = false;         // non-finite norm: no update
};

struct UnitBuffers {
  float* master = nullptr;      // [numel] fp32 master weights (MasterFormat::F32; updated in place)
  const float* grad = nullptr;  // [numel] fp32 gradient (read once); or grad_bf16 (exactly one of them)
  bf16_t* bf16 = nullptr;       // [numel] F32: streaming copy to write, may be null (no copy wanted);
                                // Split: the high halves; Bf16Sr: the bf16 master (read and written)
  uint16_t* lo = nullptr;       // [numel] Split: the remainders (read and written); nullptr for a unit whose
                                // remainders are in its NVMe image (UnitSpec::remainders_on_nvme)
  const bf16_t* grad_bf16 = nullptr;  // [numel] bf16 gradient
};

struct UpdaterStats {
  double exposed_wait_s = 0;    // time callers spent blocked in wait() (cumulative)
  double busy_s = 0;            // summed worker time in update kernels (cumulative)
  int64_t steps = 0;            // steps taken
  int64_t skipped_steps = 0;    // steps skipped for a non-finite norm
  int64_t params_updated = 0;   // elements updated (cumulative)
  int64_t nvme_read_bytes = 0;  // NVMe moments moved (cumulative; save/load included)
  int64_t nvme_write_bytes = 0;
  double nvme_io_s = 0;         // time the NVMe tier spent in reads and writes (cumulative)
};

class CpuAdamW {
 public:
  CpuAdamW(std::vector<UnitSpec> units, AdamWConfig cfg);
  ~CpuAdamW();
  CpuAdamW(const CpuAdamW&) = delete;
  CpuAdamW& operator=(const CpuAdamW&) = delete;

  // Starts step t+1 with learning rate lr (before group scaling). Requires the previous step's norm
  // to be known (all units reported). Updates of the previous step may still be running.
  void begin_step(float lr);
  // Partial sum of squares of unit u's gradient (exactly once per unit per step). Thread-safe.
  // The last unit's call fixes the norm, the clip factor and the skip decision and releases the
  // queued updates. Throws (on_nonfinite = Stop) for a non-finite norm.
  void add_grad_sumsq(int unit, double sumsq);
  // Queues unit u's update for this step (once per unit per step). Thread-safe.
  void submit(int unit, const UnitBuffers& bufs);
  // Blocks until unit u's latest submitted update (and its bf16 copy) is done; an update still held
  // back for the global norm is waited for too (so the last partial sum must come from another
  // thread, or before). For a unit with NVMe moments this includes their write-back: when wait(u)
  // returns, the file holds the updated moments and the staging slot is free. Time spent blocked is
  // counted as exposed optimizer time. Rethrows a worker's error or the NVMe tier's (lt::Error naming
  // the file, the bytes and the cause, and what it left: see docs/optimizer.md).
  void wait(int unit);
  void wait_all();
  // Element ranges of unit u (its flat buffer) that its next update runs before the rest of it, the rest after
  // every other unit's (the next step's embedding lookup needs only its batch's rows, and the forward
  // the layers' weights next). Rounded out to kQ8Block elements; for the next update only (before its submit or
  // before the norm is known); not for units with NVMe moments. The arithmetic is the same, element by element.
  void set_first_ranges(int unit, std::vector<std::pair<int64_t, int64_t>> ranges);
  // Blocks until the ranges set for unit u's latest submitted update are done (the whole update when none were
  // set); exposed time and errors as wait().
  void wait_first(int unit);
  // Convenience for a synchronous CPU caller: begin_step, CPU partial sums, submit all, wait_all.
  StepInfo step(float lr, const std::vector<UnitBuffers>& bufs);

  void set_sr_seed(uint64_t seed) { cfg_.sr_seed = seed; }  // bf16-sr: before the first step (resume)
  // The step number the messages of the next begun step name (the trainer's global step, which counts skipped
  // steps and the steps before a resume). Unset, they name this optimizer's AdamW steps taken plus those it skipped,
  // plus one.
  void set_step_number(int64_t n);
  bool norm_known() const;      // the current step's norm is fixed
  StepInfo last_step() const;   // decision of the current (or last) step; valid once norm_known()
  // Units whose partial sum of squares of the current (or last) step is non-finite, in unit order; valid once
  // norm_known(). Where a non-finite norm came from: the backward pass produces the units' gradients from the
  // last unit down.
  std::vector<int> nonfinite_units() const;
  UpdaterStats stats() const;
  int64_t step_count() const { return step_; }
  const std::vector<UnitSpec>& units() const { return units_; }
  const AdamWConfig& config() const { return cfg_; }
  Isa isa() const { return isa_; }
  int64_t state_bytes() const;  // total optimizer-state bytes (m, v, block scales), wherever they live
  MomentHomes moment_homes() const;

  // A unit whose update runs elsewhere (exec/device_update.h: on the GPU) is reported (add_grad_sumsq) but never
  // submitted; its fp32 moments here are the host copy that save() writes and load() fills. The step's constants
  // for tensor t of unit u (valid once norm_known() and the step was not skipped), and the fp32 moment arrays
  // (throws for an 8-bit tensor or moments on NVMe).
  AdamWScalars step_scalars(int unit, int tensor) const;
  std::pair<float*, float*> f32_moments(int unit, int tensor);
  // The same for either format: the fp32 arrays (m, v) or the 8-bit codes and block scales (mq, vq, ms, vs) of
  // tensor t of unit u (throws for moments on NVMe).
  MomentArrays host_moments(int unit, int tensor);
  bool is_8bit(int unit, int tensor) const;

  // Read access to a tensor's state (tests, checkpoint tools). m/v are dequantised for 8-bit tensors.
  void read_state(int unit, int tensor, std::vector<float>& m, std::vector<float>& v) const;

  // Exact save/load of moments (fp32 or 8-bit codes + block scales) and the step count. The file
  // records the unit/tensor layout and formats; load() rejects a file that does not match this
  // optimizer's layout, or is truncated or corrupted, with a message naming the file and the field.
  // Both wait for in-flight updates first.
  // (Units with remainders on NVMe: the state file holds their moments only; load() keeps the remainders the
  // unit's image holds.)
  void save(const std::filesystem::path& file);
  void load(const std::filesystem::path& file);

  // The master remainders of a unit with UnitSpec::remainders_on_nvme, elements [offset, offset + n) of its flat
  // buffer, read from its image (only the 4 KiB pages holding them). Thread-safe; not while the unit's update is in
  // flight (throws), nor after a failed write-back lost them.
  void read_remainders(int unit, int64_t offset, int64_t n, uint16_t* dst) const;
  // Replaces all of the unit's remainders (numel of them) in its image, keeping its moments. Between steps only
  // (waits for every update; throws in the middle of a step).
  void write_remainders(int unit, const uint16_t* src);

 private:
  struct TensorState {
    AlignedBuffer<float> m, v;              // F32
    AlignedBuffer<uint8_t> mq, vq;          // Q8 codes
    AlignedBuffer<float> ms, vs;            // Q8 per-block absmax scales
  };
  struct NvmeUnit {                         // the unit's place in the NVMe pipeline (nvme_moments.h)
    bool requested = false;                 // a read is queued, running or done (slot held)
    bool loaded = false;                    // the image is in `slot`
    bool want = false;                      // request the next step's read once this write-back ends
    bool lost = false;                      // a write-back failed: the moments are gone
    uint64_t ticket = 0;                    // of the current request (stale events are ignored)
    char* slot = nullptr;
    std::exception_ptr read_error;          // a prefetch failed before the update was queued
    int64_t step = 0;                       // of the latest update queued (messages)
  };
  struct UnitState {
    std::vector<TensorState> tensors;
    NvmeUnit nv;
    bool io = false;                        // NVMe unit: the update's read .. write-back in flight
    bool reported = false;
    double sumsq = 0;                       // this step's partial sum of squares
    bool submitted = false;
    UnitBuffers bufs;
    int64_t pending = 0;                    // work items not finished
    int64_t first_pending = 0;              // of them, the first ranges' (set_first_ranges)
    bool first_used = false;                // the latest update ran first ranges
    std::vector<std::pair<int64_t, int64_t>> first;  // for the next push of the unit's items
    std::exception_ptr error;
    float q_lr = 0, q_clip = 1;             // the step constants of the update queued last (enqueue_unit_locked)
    int64_t q_step = 0;
  };
  struct WorkItem;

  void enqueue_unit_locked(int unit);
  void run_item(const WorkItem& w);
  void run_tiles(const WorkItem& w, const UnitBuffers& b, int64_t off);
  void push_items_locked(int unit);
  void push_range_locked(int unit, int tensor, const AdamWScalars& s, int64_t begin, int64_t end, int64_t priority,
                         bool first);
  MomentArrays arrays(int unit, int tensor);
  void update_range(const TensorSpec& ts, const MomentArrays& st, const WorkItem& w, int64_t at, float* p,
                    const float* g, bf16_t* out, int64_t n);
  bool busy(const UnitState& s) const { return s.pending || s.io; }
  // NVMe moments (optimizer_nvme.cpp).
  void nvme_begin_step_locked();
  bool nvme_enqueue_locked(int unit);       // false: the update cannot run (error recorded) or waits for its read
  void nvme_items_done_locked(int unit);
  void on_nvme_event(int unit, bool write, uint64_t ticket, char* slot, std::exception_ptr err);
  void nvme_request_locked(int unit);
  void nvme_release_leftovers_locked();
  void nvme_check_intact_locked(const char* what) const;
  void check_buffers(int unit, const UnitBuffers& b) const;
  void finish_norm_locked();
  void zero_states();

  std::vector<UnitSpec> units_;
  AdamWConfig cfg_;
  Isa isa_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<NvmeMoments> nvme_;       // when some unit has moments_on_nvme
  std::vector<UnitState> state_;

  mutable std::mutex mu_;
  std::condition_variable done_cv_;
  int64_t step_ = 0;                        // AdamW t (steps actually taken)
  bool begun_ = false;                      // a step was begun (since construction or load)
  bool in_step_ = false;                    // begin_step called, norm not yet known
  bool norm_known_ = true;
  float lr_ = 0;
  int reported_ = 0;
  double sumsq_ = 0;
  int64_t next_step_number_ = 0;            // set_step_number() for the next begin_step; 0: unset
  int64_t step_number_ = 0;                 // the current step's, for messages
  StepInfo info_;
  AdamWScalars scal_base_;                  // per-step scalars before group scaling
  UpdaterStats stats_;
  std::atomic<int64_t> busy_ns_{0};
  std::atomic<int64_t> params_done_{0};
};

// CPU partial sum of squares of a gradient (double accumulation, vectorised). Read-only pass; the CPU
// backend calls it where it finishes a unit's gradient, while the data is still in cache.
double grad_sumsq(const float* g, int64_t n, Isa isa = Isa::Auto);
double grad_sumsq_bf16(const bf16_t* g, int64_t n);

// torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6), applied only if < 1.
float clip_coefficient(double total_norm, float max_norm);

}  // namespace lt::optim
