// ExecPlan: what the executor needs from a plan, in its own terms (src/plan's Plan converts to it).
// See docs/executor.md for the window numbering, which the planner shares.
//
// Windows: the step is the sequence of compute windows of ONE micro-batch
//   0 .. L-1            F_j   forward of layer j (window 0 also runs the embedding)
//   L                   H     head: final norm + LM head + loss, forward and backward
//   L+1 ..              for each recompute block (s,e) in reverse order (e = L first):
//                           R_j  for j = s .. e-2   recompute forward of layer j (inner boundaries)
//                           B_j  for j = e-1 .. s   backward of layer j (B_0 also runs the embedding backward)
// A transfer "assigned to window w" is issued when window w starts (it then runs beside w's compute).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lt {

enum class CkptTier : uint8_t { None = 0, Gpu = 1, Cpu = 2, Nvme = 3 };
const char* ckpt_tier_name(CkptTier t);  // "none", "gpu", "cpu", "nvme"

enum class WindowKind : uint8_t { Forward, Head, Recompute, Backward };
const char* window_kind_name(WindowKind k);  // "fwd", "head", "recompute", "bwd"

struct WindowRef {
  WindowKind kind;
  int32_t layer;  // -1 for the head window
};

// Per-window figures, predicted (by the planner/simulator) or measured (by the executor), seconds.
struct WindowFigures {
  double compute = 0;     // compute lane busy
  double h2d = 0;         // H2D lane busy (weights + checkpoint reloads)
  double d2h = 0;         // D2H lane busy (checkpoint offloads + gradients)
  double nvme_read = 0;   // NVMe reads busy
  double nvme_write = 0;  // NVMe writes busy
  double exposed = 0;     // compute waited for a transfer (or the optimizer) before this window ran
  // Measured only: the part of `exposed` during which the host was blocked waiting for a unit's
  // optimizer update (the transfer it gates could not be issued yet). exposed - exposed_optimizer is
  // the time compute waited for transfers proper.
  double exposed_optimizer = 0;
  // Measured only: the compute-lane time of the embedding's lookup and backward (ops labelled "embed.*") in this
  // window; a part of `compute` (the planner does not model it: predicted 0).
  double embedding = 0;
};

struct ExecPlan {
  int64_t batch = 0;  // samples per micro-batch
  int64_t seq = 0;
  // tier[i] for boundary i = 0..L. Materialised boundaries (tier != None) cut the layers into recompute
  // blocks; tier[0] must be materialised; boundary L is consumed by the head at once and its tier is
  // ignored (treated as Gpu).
  std::vector<CkptTier> tier;
  int32_t ring = 2;           // weight buffers on the device (>= 2); prefetch depth ring-1
  int64_t chunk_samples = 0;  // samples per chunk inside each layer pass; 0 = the whole micro-batch
  int32_t nvme_staging = 2;   // pinned staging buffers for each NVMe direction
  bool embedding_resident = true;  // false: embedding lookup/backward on the host, only boundary 0 crosses
  bool head_resident = true;       // false: head weights uploaded in window F_{L-1} instead of at step start
  // The last kept_layers layers (L - kept_layers .. L-1) keep their forward internals on the device until
  // their backward, which then does not re-run them (Backend::layer_forward_keep / layer_backward_kept).
  // Their buffers ("keep.layer<j>") are held for the whole step. Ignored by a backend that keeps nothing
  // (layer_keep_bytes 0: the CPU backend).
  int64_t kept_layers = 0;
  // Checkpoint traffic of each cpu/nvme boundary: per transfer, shares {window, fraction} covering
  // consecutive byte ranges in list order (fractions sum to 1). Empty lists = defaults:
  //   d2h        in [i, L]                       default {i, 1}
  //   nvme_write in [first d2h window, L]        default: same windows/fractions as d2h
  //   nvme_read  in [first write window, last h2d window]   default {first h2d window - 1 (>= L), 1}
  //   h2d        in [L, block_first_window(i)]   default {block_first_window(i) - 1, 1}
  // Ranges are rounded to kIoAlign (4096) bytes. A range is written after its D2H completed and
  // uploaded after its read completed; a file is read only after all of it was written (the executor
  // issues the missing earlier transfers itself, and waits, if the plan says otherwise).
  struct Share {
    int32_t window = 0;
    double fraction = 1.0;
  };
  struct Traffic {
    std::vector<Share> d2h, nvme_write, nvme_read, h2d;
  };
  std::vector<Traffic> traffic;  // size L+1 (entries of gpu/none boundaries ignored) or empty
  std::vector<WindowFigures> predicted;  // optional, per window (size = window count)
  double predicted_step_s = 0;           // optional

  // The plan that keeps every boundary on the GPU and recomputes nothing.
  static ExecPlan keep_all(int64_t layers, int64_t batch, int64_t seq);
};

// The compute-window sequence of a plan (docs above).
std::vector<WindowRef> plan_windows(const ExecPlan& p);
// First window of the block starting at materialised boundary s (its R_s, or B_s when e = s+1).
int32_t block_first_window(const ExecPlan& p, int64_t s);
// Traffic of boundary i with defaults filled in (for cpu/nvme boundaries).
ExecPlan::Traffic effective_traffic(const ExecPlan& p, int64_t i);
// Materialised boundaries, ascending (always starts with 0, ends with L).
std::vector<int64_t> plan_checkpoints(const ExecPlan& p);
// Throws lt::Error naming the field, the boundary and expected vs actual for an invalid plan.
void validate_plan(const ExecPlan& p, int64_t layers);
std::string describe_plan(const ExecPlan& p);  // one line: "ckpt 0:gpu 4:cpu 8:nvme ... ring 2 chunk 1"

}  // namespace lt
