// Plan: the schedule the executor runs for one training step, produced by the planner
// (`lazytrain plan`) and saved as versioned JSON. Full formulation: docs/planner.md.
//
// BOUNDARIES. Boundary 0 is the input of layer 0 (the embedding output), boundary i (1..L) the
// output of layer i-1. tier[i] says whether boundary i is materialised (kept for backward) and where:
//   none  not kept: regenerated during backward by recomputing its block
//   gpu   stays in HBM from when it is produced until its last backward use
//   cpu   offloaded to pinned host memory (D2H), reloaded (H2D) before its block's backward
//   nvme  offloaded like cpu, then written to an NVMe file (O_DIRECT) from pinned staging;
//         read back into staging and then H2D before its block's backward
// tier[0] and tier[L] are always gpu (the executor keeps input and output on the device, g_0=g_L=1).
//
// BLOCKS. Materialised boundaries b_0=0 < b_1 < ... < b_m=L cut the layers into recompute blocks
// (s,e) = (b_k, b_{k+1}) (the paper's edges x(s,e) on a path from 0 to L). During backward, block
// (s,e) reloads boundary s, recomputes layers s..e-2 forward to regenerate boundaries s+1..e-1
// (cost R(s,e) = sum_{j=s}^{e-2} rho_j, zero when e = s+1), then runs backward of layers e-1 down to s.
// `blocks` lists them in forward order; it is redundant with `tier` and checked against it.
//
// WINDOWS (same numbering as src/exec/exec_plan.h and docs/executor.md). The step of one
// micro-batch is the sequence of compute windows
//   0 .. L-1   F_j  forward of layer j (window 0 also does the embedding)
//   L          H    head: final norm + LM head + loss, forward and backward (chunked over tokens)
//   L+1 ..     for each block (s,e) in reverse order (e = L first):
//                R_j for j = s .. e-2   recompute forward of layer j
//                B_j for j = e-1 .. s   backward of layer j (B_0 also does the embedding backward)
// so there are 2L+1 + sum over blocks of (e-s-1) windows; plan_windows() lists them.
// A transfer assigned to window w is issued when window w starts and runs beside w's compute.
//
// CHECKPOINT TRAFFIC. For each cpu/nvme boundary i, each of its four transfers (d2h, nvme_write,
// nvme_read, h2d) is a list of shares {window, fraction}; fractions of one transfer sum to 1 and
// the shares cover consecutive byte ranges of the boundary, in list order. The planner's cost model
// is "slot" based (docs/planner.md): the recompute windows R_s..R_{e-2} and B_{e-1} of a block form
// one slot, and traffic given to that slot is assigned to its first window. Rules (validated):
//   d2h        windows in [i, L]        (after boundary i exists; i is produced by F_{i-1})
//   nvme_write windows in (first d2h window, L]; cumulative written by window w <= cumulative
//              offloaded in windows before w (a byte range is written after its D2H completed)
//   nvme_read  windows in (first nvme_write window, last h2d window], same rule against nvme_write
//   h2d of a byte range after its nvme_read (nvme) or its d2h (cpu) completed, same rule
//   h2d        windows in [L, first window of the block starting at i) (it must be complete
//              before that block starts)
// GPU memory of an offloaded boundary: a byte range is freed when its D2H completes and allocated
// again when its H2D window starts (the simulator counts HBM this way).
//
// OPTIMIZER. optimizer_8bit lists the full HF tensor names whose AdamW moments are 8-bit blockwise;
// every other tensor uses fp32 moments. Updates run on the CPU after backward (exact global-norm
// clipping), in the order layer 0..L-1, head, embedding, overlapping the next step's forward.
//
// MODEL STATE. master_weights (fp32 | bf16-sr) and gradients (host | device): where the model state
// lives (core/model_state.h, docs/memory.md). Optional in the JSON (fp32 / host when absent: plans
// written before they existed load unchanged).
#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/model_state.h"

namespace lt {

constexpr int kPlanVersion = 1;

enum class Tier : uint8_t { None = 0, Gpu = 1, Cpu = 2, Nvme = 3 };
const char* tier_name(Tier t);              // "none", "gpu", "cpu", "nvme"
Tier parse_tier(const std::string& s);      // throws lt::Error

enum class PlanWindowKind : uint8_t { Forward, Head, Recompute, Backward };
struct PlanWindow {
  PlanWindowKind kind;
  int32_t layer;  // -1 for the head window
};

struct Share {
  int32_t window = 0;
  double fraction = 1.0;
};

struct CheckpointTraffic {
  int32_t boundary = 0;
  std::vector<Share> d2h, nvme_write, nvme_read, h2d;  // nvme_* empty for cpu-tier boundaries
};

struct Block {
  int32_t start = 0, end = 0;  // s < e, both materialised
};

// Figures of one window, seconds (what the simulator predicts, and the executor measures).
struct WindowPrediction {
  double compute = 0, h2d = 0, d2h = 0, nvme_read = 0, nvme_write = 0;
  double exposed = 0;  // time the window lasted beyond its compute (transfers or optimizer waits)
};

struct PlanPrediction {
  double step_s = 0;         // one optimizer step, steady state: optimizer start .. end of backward
  double compute_s = 0;      // forward + head + backward compute (incl. each layer's internal recompute)
  double recompute_s = 0;    // block recompute R(s,e) summed
  double exposed_h2d_s = 0, exposed_d2h_s = 0, exposed_nvme_s = 0, exposed_optimizer_s = 0;
  double tflops = 0;         // 6 * N * batch * seq / step_s / 1e12
  int64_t peak_hbm = 0, peak_dram = 0, nvme_bytes = 0;
  std::vector<WindowPrediction> windows;  // per window (plan_windows order); may be empty
};

struct Plan {
  int version = kPlanVersion;
  // Shape check: the executor rejects a plan whose shape differs from the model it runs.
  std::string model;  // name (informative)
  int64_t layers = 0, hidden = 0, vocab = 0;
  int64_t batch = 0, seq = 0;
  int64_t micro_batches = 1;  // micro-batches per optimizer step (gradient accumulation); the windows repeat per micro-batch
  int64_t chunk = 0;  // samples per chunk inside a layer pass (1..batch); batch = no chunking
  int32_t ring = 2;   // weight ring buffers on the GPU (>= 2)
  int32_t nvme_staging = 2;  // pinned staging buffers per NVMe direction
  std::vector<Tier> tier;    // size L+1
  std::vector<Block> blocks;
  std::vector<CheckpointTraffic> traffic;  // one entry per cpu/nvme boundary, ascending boundary
  bool embedding_resident = false;  // false: embedding lookup/backward on the CPU, only boundary 0 crosses PCIe
  bool head_resident = false;       // false: final norm + LM head streamed in window F_{L-1}
  // The last kept_layers layers keep their forward internals in HBM for their backward (no re-run there;
  // docs/planner.md "Kept internals"). JSON "kept_layers", optional (0 when absent).
  int32_t kept_layers = 0;
  std::vector<std::string> optimizer_8bit;
  StatePlacement placement;  // JSON "master_weights", "gradients"
  // Budgets the plan was made for and who made it (informative).
  std::string planner;  // "milp", "dp", "megatrain:4", ...
  int64_t hbm_cap = 0, dram_cap = 0, nvme_cap = 0;
  PlanPrediction predicted;
};

// Window list of the plan (see header comment); index = window number.
std::vector<PlanWindow> plan_windows(const Plan& p);
// Materialised boundaries ascending (0 ... L).
std::vector<int32_t> plan_checkpoints(const Plan& p);
// Blocks derived from tier (forward order).
std::vector<Block> blocks_from_tiers(const std::vector<Tier>& tier);
// Window index where the block starting at boundary s begins (its R_s, or B_{e-1} when e = s+1).
int32_t block_first_window(const Plan& p, int32_t s);
// Consistency checks above; throws lt::Error naming the field, boundary, expected vs actual.
void validate_plan(const Plan& p);
// Also checks the shape fields against a model (layers, hidden, vocab) and batch/seq.
void check_plan_matches(const Plan& p, int64_t layers, int64_t hidden, int64_t vocab, int64_t batch, int64_t seq);

nlohmann::json plan_to_json(const Plan& p);
// Rejects unknown/missing fields and wrong versions, then validate_plan. `source` names the file in errors.
Plan plan_from_json(const nlohmann::json& j, const std::string& source = "plan");
void save_plan(const Plan& p, const std::filesystem::path& path);
Plan load_plan(const std::filesystem::path& path);

std::string describe_tiers(const Plan& p);  // "0:gpu 4:cpu 8:nvme ... 28:gpu"

}  // namespace lt
