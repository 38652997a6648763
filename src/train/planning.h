// Before the first step: the plan (where each activation checkpoint lives, what is recomputed, which
// tensors get 8-bit optimizer state), made by the planner from the resource profile and the budgets
// of the config, converted to the executor's ExecPlan, and summarised for the console.
#pragma once
#include <cstdint>
#include <optional>
#include <set>

#include "core/model_state.h"
#include <string>

#include "backend/backend.h"
#include "data/batch.h"
#include "dist/rank_cost.h"
#include "exec/exec_plan.h"
#include "model/model_config.h"
#include "nvme/io_queue.h"
#include "plan/plan.h"
#include "plan/profile.h"
#include "train/config.h"

namespace lt::train {

struct TrainingPlan {
  ExecPlan exec;
  std::set<std::string> tensors_8bit;  // hybrid: the tensors the plan switched to 8-bit state
  StatePlacement placement;            // master mode and gradient home (the plan's, or the config's)
  std::string state_table;             // where every byte of the model state lives (start-up report)
  ModelConfig model;                   // the model planned for
  std::string summary;                 // multi-line: what goes where, predicted TFLOPS, memory per tier
  std::string planner;                 // who made it
  double predicted_step_s = 0, predicted_tflops = 0;
  double predicted_exposed_transfer_s = -1, predicted_exposed_optimizer_s = -1;
  // The CPU optimizer rate the planner used for this model's units (all parameters / the summed update times), or -1.
  double predicted_optimizer_params_per_s = -1;
  int64_t device_budget = -1, host_budget = -1;  // bytes, -1 = unlimited
  // Layer forwards per micro-batch beyond the L of the forward pass (HFU): block recompute plus each
  // layer backward's recompute of its own internals.
  double extra_layer_forwards = 0;
  // The DRAM budget this process planned with: the host's (host_mem, or what is available) divided by
  // the ranks on this host under `launch` (dist::rank_profile).
  int64_t planned_dram = 0;
  // The NVMe tier's io_uring queue for the checkpoints' and the moments' files (nvme_queue_shape of the profile).
  IoQueueShape nvme_queue;
  double attention_fraction = 1.0;  // what the plan was made with (PlanRequest::attention_fraction)
};

// The attention fraction of micro-batches (PlanRequest::attention_fraction): the sum over their rows' segments of
// len^2 over rows x seq^2. A row not packed is one segment, padding included (what the executor masks): 1.
// Throws lt::Error when there are no rows.
double attention_fraction(const std::vector<data::Batch>& batches, bool packed);
// The attention fraction of the first micro-batches a loader with options lo draws from samples (from epoch 0's
// start, so that a resumed run plans alike): whole micro-batches until max_rows rows (at least one micro-batch).
// 1 without packing.
double sampled_attention_fraction(const std::vector<data::Sample>& samples, const data::LoaderOptions& lo,
                                  int64_t max_rows = 256);

// The profile's NVMe queue (nvme/io_queue.h): the rule at the larger of its NVMe read and write rates (one queue
// does both) and its nvme_latency_us (else kDefaultIoLatency), with its nvme_queue_depth / nvme_request_kib.
IoQueueShape nvme_queue_shape(const ResourceProfile& p);

// The NVMe tier's rates and request latency measured under p.nvme_dir (a 256 MiB file written and read back with
// O_DIRECT, then removed) into p, where it has room for twice that; otherwise, or when the measurement fails
// (logged), p keeps what it has. Returns whether it measured. The trainer's start-up profile on a GPU calls it.
bool measure_profile_nvme(ResourceProfile& p);

// Throws when host_mem (the host's DRAM budget for the run) is above this machine's memory (MemTotal); the plans
// themselves may describe other machines (a profile and host_mem for a host not this one).
void check_host_mem(const std::string& host_mem);

// Throws lt::Error with the planner's "does not fit: <resource> short by <bytes>" when no plan fits.
// topo: under `lazytrain launch -n N` this rank's place (rank_topology()); the plan is then one rank's:
// its share of the host's DRAM (host_mem is the HOST's budget), its gradient_accumulation_steps
// micro-batches, the collectives on its PCIe lanes (dist/rank_plan.h).
// attention_fraction: the data's (sampled_attention_fraction; 1 for unpacked rows).
TrainingPlan make_training_plan(const TrainConfig& cfg, const ModelConfig& model, int64_t batch, int64_t seq,
                                const std::string& device_name, bool on_gpu, const dist::Topology& topo = {},
                                double attention_fraction = 1.0);

// The ranks on this host from LT_LOCAL_WORLD_SIZE (`launch` sets it; the one reader of the variable): nullopt when
// unset. A clear error unless it is a whole number >= 1, and with world > 0 also <= world and dividing it.
std::optional<int> local_world_size(int world = 0);

// The topology of a rank: world ranks in all, local_world_size(world) of them on this host (unset: all of them).
dist::Topology rank_topology(int world);

}  // namespace lt::train
