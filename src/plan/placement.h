// The model-state placement decision (docs/planner.md, "Model-state placement"): which master mode,
// which gradient home and dtype, which tensors get 8-bit moments and how many layers' moments live on the NVMe tier.
// The planner walks a ladder of levels, cheapest in accuracy first, and keeps the first level with a rung whose model
// state fits and for which the DP finds a plan; of several such rungs on one level, the one whose plan simulates
// fastest:
//   1. gradients host (fp32 accumulators in DRAM), fp32 moments
//   2. gradients device (fp32, held in HBM: less DRAM, less HBM for activations)      if grads unset
//   3. + hybrid 8-bit moments (the fewest largest matrices until the state fits)    if optimizer hybrid
//   4. + gradients in bf16: held in HBM (half the HBM and staging ring), or on the host (half the DRAM, rounded on
//      the device as they leave: the same rounding)                                 if grad_dtype unset
//   5. + the input embedding's moments 8-bit too                  if optimizer adamw8bit or hybrid
//   6. + bf16-sr master (2 B/param instead of 4)                 if master unset and allow_bf16_master
//   7. + the last layers' moments on NVMe (a few counts from the fewest that fit up to room for every boundary in
//      DRAM, for each gradient home)                                               if allow_nvme_moments
//   8. + those layers' master remainders in the same NVMe files (StatePlacement::nvme_remainders: 2 B/param less
//      DRAM for them, as much more disk I/O each way)            if allow_nvme_moments and the master is split fp32
// From level 4 on every level has a rung per gradient home unless gradients are forced. On every rung the
// embedding's update runs on the GPU where device_update_blocker allows (or as forced).
// Forced modes (PlanRequest::master / grads / grad_dtype) are kept on every rung; adamw and adamw8bit
// fix the moments of the matrices on every rung.
// With PlanRequest::world > 1 (data parallelism) only rungs 1, 3 and 5 are offered, with fp32 master
// arrays and the moments sharded over the ranks (StatePlacement::moment_shards, fp32_master_array): the
// data-parallel trainer runs no other mode; a forced bf16-sr master or device gradients is an error.
#pragma once
#include <string>
#include <vector>

#include "core/model_state.h"
#include "plan/planner.h"
#include "plan/state_bytes.h"

namespace lt {

struct StateChoice {
  StatePlacement placement;
  std::vector<std::string> q8;  // tensors with 8-bit moments
  int level = 0;                // the ladder's level (rungs of one level cost the same accuracy)
};

// Why the embedding's update cannot run on the GPU under placement p (empty: it can): a tied table (on the device
// for the whole step), one process, gradients host, exact fp32 masters (split), and fp32 moments for it.
std::string device_update_blocker(const PlanRequest& r, const StateChoice& s);

// Why no decoder layer can be updated on the GPU under placement p (empty: they can): one process, gradients host,
// exact fp32 masters (split). (Layers whose moments are on NVMe are left out by the planner's search.)
std::string layer_update_blocker(const PlanRequest& r, const StateChoice& s);

// Why gradients cannot be on the host in bf16 (empty: they can): one process, one micro-batch per step (the
// executor rounds each unit's gradient on the device as it leaves).
std::string host_bf16_blocker(const PlanRequest& r);

// The rungs for a request, in order (at least one). Each rung updates the embedding on the GPU where it can, unless
// PlanRequest::embedding_update_device says otherwise.
std::vector<StateChoice> placement_ladder(const PlanRequest& r);

// The model state of a choice fits the profile's DRAM, and its HBM part leaves room on the GPU.
bool state_fits(const PlanRequest& r, const StateChoice& s);

// "master fp32, gradients device, 12 8-bit tensors": for messages.
std::string describe_choice(const StateChoice& s);

}  // namespace lt
