// Backend interface: everything the layer-streaming executor needs from a device, so that the
// executor (src/exec) is written once and runs on the CPU backend (src/backend/cpu, worker threads
// stand in for streams, host memory for device memory) and the CUDA backend (src/backend/cuda).
//
// Model of execution
//  * Three lanes run concurrently: Compute, H2D (host -> device copies), D2H (device -> host copies).
//    Work enqueued on one lane runs in enqueue order (a CUDA stream). Nothing orders two lanes except
//    events: record(lane) returns an Event that completes when everything enqueued on that lane before
//    it has finished; wait(lane, ev) makes later work on `lane` start only after `ev` completed.
//  * Every enqueue is asynchronous: it returns at once. Pointers passed to an enqueue must stay valid
//    until the work completed (use an event). Errors raised by enqueued work are reported (as lt::Error)
//    by the next synchronize()/host_wait()/check() call; after an error the backend skips further ops but
//    still completes events, so that nothing deadlocks and the caller can clean up.
//  * All methods are called from one host thread (the executor's), except host_wait() and done(), which
//    any thread may call, and MemoryTracker, which is thread-safe.
//
// Memory
//  * Two kinds: Device (HBM; host RAM on the CPU backend) and Pinned (page-locked host memory that the
//    copy engines can read and write; plain aligned host memory on the CPU backend). Pinned memory is
//    directly addressable by the host. Device memory is only touched through enqueued work.
//  * Every allocation carries a tag ("weights.ring", "ckpt.gpu", ...). A budget per kind is enforced
//    by MemoryTracker: an allocation beyond it throws "does not fit: device short by <bytes> ...".
//    Current and peak bytes are tracked per kind and per tag.
//  * Alignment: device allocations are 256-byte aligned, pinned ones 4096-byte aligned (O_DIRECT).
//
// Ops (all enqueued on the Compute lane; every pointer is device memory of the backend's dtypes)
//    They follow src/backend/cpu/reference.h exactly (same layouts, conventions and accumulation
//    rules): activations [T, hidden] row-major, sample-major; weights of a unit are one flat buffer
//    laid out by UnitLayout (in dtypes().weight); gradients in dtypes().grad, ACCUMULATED (+=) into.
//    Cross-sample reductions are accumulated sample by sample in sample order, so calling an op on a
//    batch or on consecutive chunks of samples gives bit-identical results (on the CPU backend).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt {

// One AdamW step's constants for a tensor whose update runs on the device (exec/device_update.h): the fields of
// optim::AdamWScalars (optim/adamw_kernels.h), so that the backends need not depend on the optimizer. beta1 and
// inv_bc2_sqrt are read by the 8-bit path only (appended last so that positional initialisers stay valid).
struct AdamWStepScalars {
  float decay = 1, w1 = 0.1f, beta2 = 0.999f, w2 = 0.001f, eps = 1e-8f, bc2_sqrt = 1, neg_step_size = 0,
        grad_scale = 1;
  float beta1 = 0.9f, inv_bc2_sqrt = 1;
};

// One 8-bit dynamic quantisation map as the backends read it: the fields of optim::QuantMap (optim/quant8.h) that
// decoding and quantising use, copied (exec/device_q8.h) so that the backends need not depend on the optimizer.
// decode: code -> value in [-1, 1]; top, inv_step, code_off: per decade e, 10^-e and the quantiser's line
// code = round(fma(|y|, inv_step[e], code_off[e])).
struct Q8Map {
  int32_t is_signed = 0, mag_bits = 0;
  float decode[256] = {};
  float top[8] = {};
  float inv_step[8] = {};
  float code_off[8] = {};
};
// m: the signed map (first moment); v: the unsigned map (second moment).
struct Q8Maps {
  Q8Map m, v;
};

enum class MemKind : uint8_t { Device = 0, Pinned = 1 };
const char* mem_kind_name(MemKind k);  // "device", "pinned"

enum class Lane : uint8_t { Compute = 0, H2D = 1, D2H = 2 };
constexpr int kNumLanes = 3;
const char* lane_name(Lane l);  // "compute", "h2d", "d2h"

// Budgets, current and peak bytes per memory kind and per tag. Shared by all backends.
class MemoryTracker {
 public:
  static constexpr int64_t kUnlimited = -1;
  void set_budget(MemKind k, int64_t bytes);  // kUnlimited (or < 0) = no limit
  int64_t budget(MemKind k) const;
  // Throws lt::Error "does not fit: <kind> short by <bytes> (<tag> asks <bytes>, in use <bytes> of <budget>)".
  void reserve(MemKind k, int64_t bytes, const std::string& tag);
  void release(MemKind k, int64_t bytes, const std::string& tag);
  int64_t current(MemKind k) const;
  int64_t peak(MemKind k) const;
  void reset_peaks();  // peaks := current
  struct TagStat {
    MemKind kind;
    std::string tag;
    int64_t current = 0, peak = 0, count = 0;  // count = live allocations
  };
  std::vector<TagStat> tags() const;  // sorted by kind, then tag
  std::string table() const;          // printable table of tags with totals and budgets

 private:
  mutable std::mutex mu_;
  int64_t budget_[2] = {kUnlimited, kUnlimited};
  int64_t cur_[2] = {0, 0}, peak_[2] = {0, 0};
  std::map<std::pair<int, std::string>, TagStat> tags_;
};

// A block of backend memory. Owned by whoever allocated it; free with Backend::free (or use Buffer).
struct Allocation {
  void* ptr = nullptr;
  int64_t bytes = 0;
  MemKind kind = MemKind::Device;
  std::string tag;
  explicit operator bool() const { return ptr != nullptr; }
};

// Opaque completion marker; each backend derives its own. Shared so that it can outlive a lane's queue.
struct EventImpl {
  virtual ~EventImpl() = default;
};
using Event = std::shared_ptr<EventImpl>;

// What an enqueued piece of work is, for timing spans and traces.
struct OpLabel {
  const char* what = "";  // static string: "fwd", "bwd", "recompute", "w.h2d", "ckpt.d2h", ...
  int32_t window = -1;    // the executor's window index (docs/executor.md), -1 if none
  int32_t index = -1;     // layer / boundary / unit the work is about, -1 if none
};

// A finished piece of work on a lane, times in seconds on now_seconds()'s clock.
struct Span {
  Lane lane;
  OpLabel label;
  int64_t bytes = 0;  // copies: bytes moved
  double t0 = 0, t1 = 0;
};

// Dtypes the backend computes in. The executor sizes buffers and converts host data with these.
struct BackendDTypes {
  DType act = DType::F32;     // boundary activations and their gradients
  DType weight = DType::F32;  // streamed weights (the host "streaming copy" has this dtype)
  DType grad = DType::F32;    // weight gradients produced on the device
};

// Sequence geometry of the rows an op works on; positions/segments are DEVICE pointers to int32
// [batch*seq] (nullptr: 0..seq-1 per sample / one segment per sample), already offset to the chunk.
struct DevGeometry {
  int64_t batch = 0;
  int64_t seq = 0;
  const int32_t* positions = nullptr;
  const int32_t* segments = nullptr;
  // With segments: the runs of equal ids within the samples (one a sequence the rows pack) and the longest run,
  // counted on the host (MicroBatchRun::count_segment_runs); 0 = not counted (the CUDA backend then attends with
  // its own kernels rather than cuDNN's packed graphs, which are built for these counts).
  int64_t runs = 0, longest_run = 0;
  int64_t tokens() const { return batch * seq; }
};

class Backend {
 public:
  explicit Backend(const ModelConfig& c);
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H200)", ...
  // The kernel variants this backend runs, one line for the run header ("kernels: ..."); empty: no choices.
  virtual std::string describe_kernels() const { return {}; }
  virtual BackendDTypes dtypes() const = 0;
  const ModelConfig& config() const { return cfg_; }
  const ModelLayout& layout() const { return layout_; }
  MemoryTracker& memory() { return mem_; }

  // ---- memory ----
  // Reserves against the kind's budget (throws "does not fit: ..."), then allocates. bytes > 0.
  virtual Allocation alloc(MemKind k, int64_t bytes, const std::string& tag) = 0;
  // Frees now: the caller guarantees no enqueued work still uses it (synchronize first). Null is a no-op.
  virtual void free(Allocation& a) = 0;
  // Extra device bytes one layer_forward/layer_backward on `tokens` rows needs internally (the backend
  // reserves it itself from the Device budget under tag "workspace" when first needed). seq: the rows per
  // sample when the call splits into samples of that length (a Gated DeltaNet workspace depends on the
  // split); 0 (or not a divisor of tokens): one sample of `tokens` rows, the largest case.
  virtual int64_t layer_workspace_bytes(int64_t tokens, int64_t seq = 0) const = 0;
  // Reserves the workspace for layers/head on up to `tokens` rows (samples of `seq`) now, so that a plan that
  // cannot fit fails before running.
  virtual void reserve_workspace(int64_t tokens, int64_t seq = 0) = 0;
  // Extra device bytes one embed_backward on `tokens` rows needs, in the same workspace (layer_workspace_bytes
  // counts it at its own `tokens` only). Default: none.
  virtual int64_t embed_workspace_bytes(int64_t tokens) const {
    (void)tokens;
    return 0;
  }
  // The workspace of a run, sized once for every call it will make (the largest layer_workspace_bytes over its call
  // geometries, embed_workspace_bytes) and taken before its other device buffers: `bytes` reserved now (what was
  // reserved before is released first) and held at that size until release_workspace(). Meanwhile an op that would
  // need more throws an internal error naming the op and its rows, rather than regrowing it: a workspace released
  // and taken again larger after other buffers were allocated may find the budget's free bytes in pieces (the
  // device arena's first fit), each too small, though their total fits.
  virtual void hold_workspace(int64_t bytes);
  // Frees the workspace; ops take it again, growing it as they need. No-op when there is none.
  virtual void release_workspace() {}
  // Before the first layer call at geometry g (its segment runs counted): builds what such a call would build once,
  // on the host (CUDA: cuDNN's attention graphs for g's packed-row shape, 0.1-2 s the first time), so that it does
  // not land in a timed step. No device work; g's device pointers are not read. Default: nothing.
  virtual void prepare_geometry(const DevGeometry& g) { (void)g; }

  // ---- lanes and events ----
  virtual Event record(Lane lane) = 0;
  virtual void wait(Lane lane, const Event& ev) = 0;  // null ev: no-op
  virtual void host_wait(const Event& ev) = 0;        // blocks the host; throws the lanes' first error
  virtual bool done(const Event& ev) = 0;             // non-blocking query
  virtual void synchronize() = 0;                     // all lanes idle; throws the first error
  virtual void check() = 0;                           // throws the first error of enqueued work, if any
  virtual void clear_error() = 0;                     // forget a reported error (after cleanup)

  // Copies. H2D: dst Device, src Pinned; D2H: dst Pinned, src Device; Compute: device to device.
  virtual void copy(Lane lane, void* dst, const void* src, int64_t bytes, OpLabel l) = 0;
  virtual void fill_zero(Lane lane, void* dst, int64_t bytes, OpLabel l) = 0;

  // ---- timing ----
  // When on, every enqueued op produces a Span (CUDA: event pairs, resolved at take_spans()).
  virtual void set_timing(bool on) = 0;
  virtual std::vector<Span> take_spans() = 0;  // after synchronize(); clears the list

  // ---- ops (Compute lane), contracts as src/backend/cpu/reference.h ----
  // x[T, hidden] = emb[ids]
  virtual void embed_forward(const void* emb, const int32_t* ids, int64_t T, void* x, OpLabel l) = 0;
  // demb[ids[t]] += dx[t] (in sample order)
  virtual void embed_backward(const int32_t* ids, int64_t T, const void* dx, void* demb, OpLabel l) = 0;
  // y = layer(x) for decoder layer `layer` with weights w (layout_.layer(layer)).
  virtual void layer_forward(int64_t layer, const void* w, const DevGeometry& g, const void* x, void* y,
                             OpLabel l) = 0;
  // Recomputes internals from x; writes dx, ACCUMULATES dw.
  virtual void layer_backward(int64_t layer, const void* w, const DevGeometry& g, const void* x,
                              const void* dy, void* dx, void* dw, OpLabel l) = 0;
  // ---- kept internals (ExecPlan::kept_layers): a layer's forward leaves what its backward needs in a buffer of
  // the caller's, and the backward reads it instead of re-running the forward (the re-run is ~1/5 of a
  // dense layer's training FLOPs).
  // Bytes that buffer needs for one call of layer `layer` on batch x seq rows; 0: this backend keeps nothing and
  // the two calls below are plain layer_forward / layer_backward.
  virtual int64_t layer_keep_bytes(int64_t layer, int64_t batch, int64_t seq) const {
    (void)layer, (void)batch, (void)seq;
    return 0;
  }
  // layer_forward that also fills keep (device, layer_keep_bytes(layer, g.batch, g.seq) bytes, 256-byte aligned).
  virtual void layer_forward_keep(int64_t layer, const void* w, const DevGeometry& g, const void* x, void* y,
                                  void* keep, OpLabel l) {
    (void)keep;
    layer_forward(layer, w, g, x, y, l);
  }
  // layer_backward from keep as layer_forward_keep of the same layer, weights, geometry and x left it (keep is
  // scratch afterwards). Same results as layer_backward.
  virtual void layer_backward_kept(int64_t layer, const void* w, const DevGeometry& g, const void* x, const void* dy,
                                   void* dx, void* dw, void* keep, OpLabel l) {
    (void)keep;
    layer_backward(layer, w, g, x, dy, dx, dw, l);
  }
  // Head (final norm + LM head + CE) on the rows of g, targets already shifted (-100 ignored).
  // acc: device double[2]; acc[0] += loss_sum, acc[1] += n_tokens (non-ignored), added sample by sample.
  // If dx != nullptr: gradients of loss_sum * loss_scale: writes dx, ACCUMULATES d_head_w and d_lm_w
  // (d_lm_w is the embedding's gradient when tied).
  virtual void head_loss(const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g,
                         const void* x, float loss_scale, void* dx, void* d_head_w, void* d_lm_w, double* acc,
                         OpLabel l) = 0;
  // out[n_rows, vocab] (fp32, device) = logits of the given rows (rows: device int64).
  virtual void head_logits(const void* head_w, const void* lm_w, const void* x, const int64_t* rows,
                           int64_t n_rows, float* out, OpLabel l) = 0;
  // ---- the LM head's weight gradient by vocabulary slices (no [vocab, hidden] fp32 buffer; has_sliced_head_grad) ----
  // head_loss_lse: head_loss without the LM weight's gradient: d_norm_w ACCUMULATES the final norm's gradient (hidden
  // elements) and lse (device float[g.tokens()]) receives each row's log-sum-exp of its logits.
  // head_lm_grad_slice: dw[n_v, hidden] (dtypes().grad, ACCUMULATES) += rows v0 .. v0+n_v-1 of the d_lm_w that head_loss
  // would accumulate for the same rows, computed again from their logits in those columns and lse: one more logits
  // GEMM for the whole head, and each gradient element summed over the rows in the order head_loss sums it.
  virtual bool has_sliced_head_grad() const { return false; }
  virtual void head_loss_lse(const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g,
                             const void* x, float loss_scale, void* dx, void* d_norm_w, float* lse, double* acc,
                             OpLabel l);
  virtual void head_lm_grad_slice(const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g,
                                  const void* x, const float* lse, float loss_scale, int64_t v0, int64_t n_v, void* dw,
                                  OpLabel l);
  // The embedding's gradient accumulated into a held one: acc (acc_dtype, the table's shape) += each id's rows of dx
  // summed in token order, rounded once (BF16: as grad_add rounds), so that it equals embed_backward into a zeroed
  // dtypes().grad buffer followed by grad_add; if sumsq != nullptr, *sumsq += the sum of squares of the whole acc as
  // stored afterwards. For held bf16 gradients without a table-sized fp32 buffer.
  virtual void embed_backward_acc(const int32_t* ids, int64_t T, const void* dx, void* acc, DType acc_dtype,
                                  double* sumsq, OpLabel l);
  // *out (device double) += sum of squares of grad[0..n) (dtypes().grad), accumulated in fp64.
  // Used for exact global-norm clipping without a second pass over gradients on the host.
  virtual void grad_sumsq(const void* grad, int64_t n, double* out, OpLabel l) = 0;
  // acc[i] += grad[i] for i < n (grad in dtypes().grad), in place, element by element; acc is fp32, or
  // bf16 (acc_dtype BF16: the fp32 sum rounded to nearest-even). If sumsq != nullptr, *sumsq (device
  // double) += sum of squares of the updated acc (as stored), accumulated in fp64.
  // Sums micro-batch gradients into an accumulator held on the device (docs/executor.md).
  virtual void grad_add(void* acc, DType acc_dtype, const void* grad, int64_t n, double* sumsq, OpLabel l) = 0;
  // AdamW with fp32 moments over n elements in device memory (a unit updated on the device, exec/device_update.h):
  // the CPU optimizer's fp32 path, the same IEEE operations in the same order (optim/adamw_kernels.h), so the results
  // are bit-identical. The master is fp32 in p (hi, lo null; an fp32-streaming backend's weights), or split (p
  // null): hi the bf16 high halves, which are the weights the layers read, and lo the 16-bit remainders
  // (core/split_master.h). g fp32, read; m, v fp32, updated in place. Backends without it throw.
  virtual void adamw_step(const AdamWStepScalars& s, float* p, bf16_t* hi, uint16_t* lo, const float* g, float* m,
                          float* v, int64_t n, OpLabel l);
  // AdamW with 8-bit blockwise moments over one tensor of n elements in device memory: the CPU optimizer's scalar
  // 8-bit path (optim::adamw_q8, bit-identical). mq, vq the codes (maps.m, maps.v), ms, vs the ceil(n / 256) absmax
  // scales (one per 256 elements from the tensor's start; the last block may be partial), all updated in place;
  // master and g as in adamw_step. Backends without it throw.
  virtual void adamw_step_q8(const AdamWStepScalars& s, const Q8Maps& maps, float* p, bf16_t* hi, uint16_t* lo,
                             const float* g, uint8_t* mq, uint8_t* vq, float* ms, float* vs, int64_t n, OpLabel l);

 protected:
  ModelConfig cfg_;
  ModelLayout layout_;
  MemoryTracker mem_;
};

// The internal error of an op that asks `asks` bytes of workspace while a run holds it at `held`
// (Backend::hold_workspace): names the op, its label (window, layer) and its rows.
[[noreturn]] void fail_workspace_held(const char* op, const OpLabel& l, int64_t rows, int64_t asks, int64_t held);

// RAII owner of one allocation.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& b, MemKind k, int64_t bytes, const std::string& tag) : be_(&b), a_(b.alloc(k, bytes, tag)) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept : be_(o.be_), a_(o.a_) { o.a_ = {}; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_;
      a_ = o.a_;
      o.a_ = {};
    }
    return *this;
  }
  void reset() {
    if (be_ && a_) be_->free(a_);
    a_ = {};
  }
  void* data() const { return a_.ptr; }
  template <typename T> T* as() const { return static_cast<T*>(a_.ptr); }
  int64_t bytes() const { return a_.bytes; }
  explicit operator bool() const { return a_.ptr != nullptr; }

 private:
  Backend* be_ = nullptr;
  Allocation a_;
};

}  // namespace lt
