// Instance: the numbers of one planning problem (model x batch x seq x machine), in the planner's
// "slot" cost model (docs/planner.md). The simulator, the DP and the MILP all read this.
//
// Slots (fixed count 2L+1, independent of the plan):
//   slot j        = F_j (forward of layer j), j = 0..L-1
//   slot L        = H   (head forward + backward)
//   slot 2L - j   = B_j (backward of layer j; when j = e-1 of a block (s,e) with e-s >= 2 the slot also
//                   runs the block's recompute R_s..R_{e-2} first)
// Barrier rule: a slot's transfers start with the slot; the next slot starts when the slot's compute
// and all its transfers are done (and, for F_{j-1}, when the CPU optimizer has finished layer j).
// Slot time T = max(C, pcie(h, d), r / nvme_read_bw, w / nvme_write_bw),
//   pcie(h, d) = max(h / h2d_bw, d / d2h_bw, (h + d) / both_bw).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/model_state.h"
#include "plan/collectives.h"
#include "model/model_config.h"
#include "plan/profile.h"
#include "plan/state_bytes.h"

namespace lt {

// The activation checkpoints' NVMe transfers on one step's timeline (the simulator builds it from a plan's slots,
// simulator.cpp): the moments' I/O queue shares the disk with them. Rule: a checkpoint transfer keeps its lane (NVMe
// read or write) at the lane's full rate from its slot's start, as the slot cost model times it; a moment read or
// write-back uses only the lane's time the checkpoints leave. The slots follow the simulator's: the first starts
// `lead` after max(O(layer 0), device_update_s), slot w at max(the previous slot's end, its layer's update); later
// micro-batches repeat prologue, slots and epilogue without waits.
struct CheckpointNvmeIo {
  double lead = 0;                      // the weight all-gather and the prologue
  double prologue_s = 0, epilogue_s = 0;
  std::vector<double> slot_s;           // per slot (instance.h numbering): its time T
  std::vector<double> read_s, write_s;  // per slot: its checkpoint read / write at the lane's full rate
  bool any() const;                     // any checkpoint transfer on the NVMe lanes
};

// Layers need not be alike (hybrid models mix attention and Gated DeltaNet layers in any order): every
// per-layer quantity is a vector indexed by layer. Boundaries are alike (A is the hidden state of every
// kind), so tier capacities are still counts of boundaries.
struct Instance {
  int L = 0;
  int micro_batches = 1;  // per optimizer step; the optimizer overlaps the first micro-batch only
  std::vector<LayerKind> kind;  // per layer (empty: all Attention); display only, the costs below carry it
  std::vector<double> rho;   // forward time of layer j
  std::vector<double> beta;  // backward slot base time of layer j: its backward + re-run of its internals
  // Kept internals (docs/planner.md "Kept internals"): layer j's backward slot base time when its forward kept its
  // internals in HBM (no re-run; 0: this layer cannot keep), and the HBM one kept layer holds for the step
  // (its whole micro-batch, every chunk: ceil(batch / chunk) chunks, as the executor allocates them).
  std::vector<double> beta_kept;
  std::vector<double> keep_bytes;
  int kept = 0;  // the last `kept` layers keep their internals: their beta is beta_kept, hbm_fixed holds keep_bytes
  double head_s = 0;         // head slot compute
  // Bytes.
  double A = 0;              // one boundary
  std::vector<double> P;     // layer j's bf16 weights (H2D per use)
  std::vector<double> G;     // layer j's gradient D2H per backward (0: held on the device, gradients: device)
  double P_head = 0;  // head weights streamed in F_{L-1}
  double G_head = 0;  // head gradient, D2H in B_{L-1} (held on the device: only a tied matrix's, for the CPU embedding)
  double pro_h2d = 0; // prologue H2D besides layer 0's weights (boundary 0 from the CPU embedding)
  double epi_d2h = 0; // epilogue D2H besides layer 0's gradient (boundary-0 gradient for the CPU embedding backward)
  // Data parallelism: the collectives' bytes (collectives.h), once per optimizer step: the weight
  // all-gather before the first micro-batch's prologue, the gradient reduce-scatter after the last
  // micro-batch's epilogue.
  StepCollectives coll;
  // Bandwidths, bytes/s.
  double bh = 1, bd = 1, bb = 1, bnr = 1, bnw = 1;
  // CPU optimizer time per unit: layers 0..L-1, then head, then embedding (size L+2); updated in opt_order().
  std::vector<double> opt;
  // Units updated on the GPU (StatePlacement::embedding_update_device, device_update_layers: their opt is 0, their
  // weights and gradients do not cross PCIe): the GPU time of their updates, before the next step's prologue (the CPU
  // optimizer starts on the other units meanwhile).
  double device_update_s = 0;
  // Gradients held on the device (gradients: device): D2H time of each unit's gradient, indexed as opt
  // (empty: none). One stream from the step's start in opt_order(); a unit's update waits for its gradient.
  std::vector<double> opt_d2h;
  // The pinned staging ring those gradients stream through (exec/grad_stream.h; 0: unbounded): a unit's D2H waits
  // for room, and a unit's part of the ring is freed only when the next forward has waited for its update. See
  // opt_done_ring().
  double grad_ring_bytes = 0;
  // Units whose moments live on the NVMe tier (StatePlacement::nvme_layers, optim/nvme_moments.h), indexed as opt
  // (empty: none; 0 for a unit in DRAM): the read and the write-back of the unit's moment image. One I/O queue
  // (write-backs first, then reads in update order) through nvme_slots DRAM slots: the first nvme_slots units are
  // read ahead during the previous step's forward and backward, each later read waits for a slot (the write-back
  // nvme_slots units earlier), a unit's update waits for its read, and its wait (the next forward's) ends with
  // its write-back. See opt_done().
  std::vector<double> nvme_read, nvme_write;
  int nvme_slots = 3;  // AdamWConfig::nvme_slots
  // The I/O queue's busy time per step (every read and write-back of the NVMe units).
  double nvme_io_s() const;
  // The instance the DP and the MILP plan on: with NVMe-moment units, the checkpoints' NVMe rates lowered by the share
  // of a step the moments' reads (writes) keep the disk busy, the step taken as its compute (layers and head, no
  // recompute: the share is the largest it can be), at least a tenth of the rate left. The simulator keeps the true
  // rates and shares the lanes op by op (CheckpointNvmeIo); the solvers' slot rows have no such coupling.
  Instance solver_view() const;
  // GPU memory, bytes. Usable = hbm cap - reserve; hbm_fixed is held for the whole step (the model's
  // gradients with gradients: device), so the plan's slots have hbm_room().
  double hbm_cap = 0, hbm_fixed = 0;
  double ring = 0;             // weight ring: k buffers of the largest layer (k * max_j P[j])
  std::vector<double> ws_fwd;  // forward slot of layer j: transient (workspace), besides input and output boundaries
  std::vector<double> ws_bwd;  // backward slot of layer j: its internals + workspace + dY/dX + gradient buffers
  double ws_head = 0;  // head slot: head weights + grads + logits chunk + dX
  double ws_pro = 0;   // prologue / epilogue
  // Host memory and NVMe, bytes.
  double dram_cap = 0, dram_fixed = 0;
  double nvme_cap = 0;
  int staging = 2;     // pinned NVMe staging buffers per direction (DRAM 2*staging*A when any NVMe)
  bool allow_nvme = true;

  int slots() const { return 2 * L + 1; }
  double hbm_room() const { return hbm_cap - hbm_fixed; }
  int slot_F(int j) const { return j; }
  int slot_H() const { return L; }
  int slot_B(int j) const { return 2 * L - j; }
  LayerKind kind_of(int j) const { return kind.empty() ? LayerKind::Attention : kind[size_t(j)]; }
  double pcie(double h, double d) const;
  double slot_time(double C, double h, double d, double r, double w) const;
  // Optimizer finish times, indexed as opt, in the update order opt_order() (u' before u):
  // O(u) = max(O(u'), D(u), R(u)) + opt[u], D(u) = the held gradients' D2H up to u in that order, R(u) the end of
  // an NVMe unit's read (0 for the others); an NVMe unit's O(u) is the end of its write-back.
  // With ck (non-null, any()), the NVMe units' reads and write-backs share the lanes with the checkpoints
  // (CheckpointNvmeIo's rule).
  std::vector<double> opt_done(const CheckpointNvmeIo* ck = nullptr) const;
  // opt_done without NVMe units, with the staging ring bounded (grad_ring_bytes > 0): unit u's gradient
  // (opt_d2h[u] * bd bytes) is copied once the ring has room for it, room freed by the units copied before it at
  // max(O(u'), reach[u']), reach[u'] = when the next forward waits for u' (its slot start; the simulator's).
  std::vector<double> opt_done_ring(const std::vector<double>& reach) const;
  std::vector<size_t> opt_order() const;  // embedding (L+1), layers 0..L-1, head (L): the executor's
  // The next forward waits for the embedding's whole update (a table on the device, tied or resident; data
  // parallelism); false: only for the next batch's rows, which the optimizer runs first (an untied table looked
  // up on the host, Executor::set_next_step_ids), the rest after every other unit: order layers, head, embedding.
  bool embedding_first = true;
  // When the last update ends, or later the NVMe queue: its last write-back and then the read-ahead of the next
  // step's first nvme_slots units.
  double opt_last(const CheckpointNvmeIo* ck = nullptr) const;
  double R(int s, int e) const;         // block recompute time: rho[s..e-2]
  double R_bytes(int s, int e) const;   // weights the block's recompute loads: P[s..e-2]
  // Mandatory traffic of the slot cost model (docs/planner.md): H2D in F_j (the next layer's weights,
  // the head's after the last), in H (layer L-1's) and in B_j (layer j-1's); D2H in B_j (layer j+1's
  // gradient, the head's for j = L-1).
  double h_F(int j) const { return j < L - 1 ? P[size_t(j + 1)] : P_head; }
  double h_H() const { return P[size_t(L - 1)]; }
  double h_B(int j) const { return j > 0 ? P[size_t(j - 1)] : 0; }
  double d_B(int j) const { return j < L - 1 ? G[size_t(j + 1)] : G_head; }
  double prologue() const { return pcie(P[0] + pro_h2d, 0); }   // layer 0's weights + boundary 0
  double epilogue() const { return pcie(0, G[0] + epi_d2h); }   // layer 0's gradient + boundary-0 gradient
  double step_prologue() const { return pcie(coll.weight_h2d, coll.weight_d2h); }  // once per step
  double step_epilogue() const { return pcie(coll.grad_h2d, coll.grad_d2h); }      // once per step
  // Largest per-layer working set: what every plan needs in some slot.
  double max_ws_bwd() const;
  // HBM a block (s,e) needs in its backward slots with nothing else resident: boundary 0, its start,
  // its regenerated inner boundaries and the largest layer working set among them, plus the ring.
  double block_floor(int s, int e) const;
};

struct InstanceOptions {
  int ring = 2;
  int64_t chunk = 0;  // 0: whole batch
  std::vector<std::string> optimizer_8bit;  // tensors with 8-bit moments
  StatePlacement placement;                 // master mode and gradient home
  bool allow_nvme = true;
  int64_t head_chunk_tokens = 4096;  // the CUDA head's logits chunk (LayerEngine::head_chunk_)
  int micro_batches = 1;
  StepCollectives collectives;  // data parallelism: bytes per rank per step
  bool embedding_rows_first = true;  // PlanRequest::embedding_rows_first
  double attention_fraction = 1.0;   // PlanRequest::attention_fraction (packed_layer_times)
};

Instance make_instance(const ModelConfig& c, int64_t batch, int64_t seq, const ResourceProfile& prof,
                       const InstanceOptions& o);

// The CPU optimizer's updates run beside the next step's forward, whose weight uploads read the same host memory:
// the profile's rates (the optimizer alone) are divided by this factor, 1 - the share of the host's memory traffic
// (2 x its copy bandwidth: each copied byte is read and written) the uploads take (sum P_j / sum rho_j, at most the
// H2D bandwidth), at least 0.5. make_instance applies it to every unit but an embedding updated before the forward
// (embedding_first). The forward's checkpoint D2H (the plan's choice) takes more; not counted. Measured (H200, Qwen2.5-3B,
// 8-bit, the embedding on the GPU): 9.5 Gparams/s alone, 7.8 beside the forward; factor 0.86, exposed optimizer
// predicted 67.9 against 63-70 ms (22.0 without it).
double optimizer_derate(const Instance& in, const ResourceProfile& prof);

// Number of trailing layers that can keep their internals (beta_kept > 0 and keep_bytes > 0), counted from
// layer L-1 down to the first that cannot.
int keepable_tail(const Instance& in);
// A copy of `in` (which must keep no layer yet) where layers L-k .. L-1 keep their internals: beta[j] =
// beta_kept[j], hbm_fixed += keep_bytes[j], kept = k. Throws lt::Error naming the layer when k exceeds
// keepable_tail(in), and when k < 0.
Instance with_kept(const Instance& in, int k);
// HBM the kept layers hold (the sum of keep_bytes over the last in.kept layers; part of hbm_fixed).
double kept_hbm(const Instance& in);

}  // namespace lt
