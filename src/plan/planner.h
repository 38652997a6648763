// The planner entry point: picks the model-state placement (master mode, gradient home, hybrid 8-bit
// moments: placement.h) and the chunk, builds the Instance, runs the DP, the heuristics and the MILP, scores every candidate with the simulator
// and returns the best feasible plan (never worse than the DP's or any heuristic's).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/model_state.h"
#include "model/model_config.h"
#include "plan/collectives.h"
#include "plan/dp.h"
#include "plan/instance.h"
#include "plan/milp.h"
#include "plan/plan.h"
#include "plan/profile.h"
#include "plan/simulator.h"
#include "plan/state_bytes.h"

namespace lt {

struct PlanRequest {
  ModelConfig model;
  int64_t batch = 1, seq = 1024;
  int micro_batches = 1;            // per optimizer step
  ResourceProfile profile;
  std::string planner = "milp";     // milp | dp | megatrain:K | all-gpu | sqrt | cpu-all
  std::string optimizer = "hybrid"; // adamw | adamw8bit | hybrid
  int ring = 2;
  int64_t chunk = 0;                // 0: the largest that fits
  bool compare = true;              // also score every heuristic (side-by-side table)
  MilpOptions milp;
  // Model-state placement (placement.h): unset = the planner chooses.
  std::optional<MasterMode> master;  // unset: fp32, or bf16-sr as the last resort when allow_bf16_master
  std::optional<GradHome> grads;     // unset: host if the model state fits the DRAM, else device
  std::optional<GradDType> grad_dtype;  // of held gradients; unset: fp32, bf16 if fp32 does not fit
  bool allow_bf16_master = false;    // `--master-weights auto`
  bool allow_nvme_moments = false;   // `--optimizer-nvme auto`: the last rung puts layers' moments on NVMe
  // With allow_nvme_moments and split fp32 masters, a last rung puts those layers' master remainders on NVMe too
  // (StatePlacement::nvme_remainders); false: not offered (a caller that cannot run it).
  bool allow_nvme_remainders = true;
  // `--optimizer-nvme all` (config optimizer_nvme: all): every decoder layer's moments on NVMe in every rung, so the
  // plan's byte table, NVMe space and simulated disk time are those the trainer runs.
  bool nvme_all_layers = false;
  bool explain = true;               // when nothing fits, re-plan to name the smallest change that fits
  // Of several placements on one level of the ladder that fit (placement.h), take the one whose plan simulates
  // fastest; false: the first (feasibility searches: --batch max, the fit advice's checks).
  bool fastest_placement = true;
  // Kept internals (docs/planner.md "Kept internals"): let the last k layers keep their forward internals in HBM
  // (no re-run in their backward) when the profile measured it and it makes the step faster; k in Plan::kept_layers.
  bool keep_internals = true;
  // The trainer runs an untied host-looked-up table's next-step rows first (config embedding_rows_first): the
  // next forward does not wait for the whole table's update (Instance::embedding_first).
  bool embedding_rows_first = true;
  // Gradients held on the device: the depth of their pinned staging ring in median layers (StatePlacement::
  // grad_ring_depth, kept on every rung); 0: the planner's (8, or a shallower ring where its DRAM makes the simulated
  // step faster; the simulator bounds the optimizer by the ring, Instance::opt_done_ring).
  int grad_ring_depth = kGradRingDepth;
  // The head's gradient by vocabulary slices (StatePlacement::head_grad_slices, where head_grad_slices_apply): unset =
  // the planner's (the step planned with them too, and the faster kept), true = wherever it applies, false = never.
  std::optional<bool> head_grad_slices;
  // The embedding's update on the GPU (StatePlacement::embedding_update_device): unset = wherever eligible
  // (placement.h device_update_eligible), true = required (an error naming why not, when it cannot), false = never.
  std::optional<bool> embedding_update_device;
  // The first k decoder layers updated on the GPU (StatePlacement::device_update_layers): unset = the k that
  // simulates fastest where eligible (placement.h layer_update_blocker; 0 where not), a number = that k (an error
  // naming why, when it cannot).
  std::optional<int64_t> device_update_layers;
  // Data parallelism (docs/planner.md, "Data parallelism"): the plan is one rank's. `profile` is then
  // the rank's share of the host (dist::rank_profile); world > 1 shards the moments over the ranks,
  // keeps full fp32 master arrays and host gradients (what the data-parallel trainer runs: no device
  // gradients, bf16-sr masters or NVMe moments) and adds `collectives` to the PCIe lanes.
  // Packed rows (docs/planner.md "Packed rows"): the data's expected sum over a row's segments of len^2 / seq^2; the
  // attention core's share of each attention layer's time is scaled by it (packed_layer_times). 1: every row is one
  // causal segment (unpacked rows).
  double attention_fraction = 1.0;
  int world = 1;            // ranks in all
  int ranks_per_host = 1;   // ranks sharing one host's DRAM (messages: the host total)
  StepCollectives collectives;  // bytes per rank per step
};

struct Candidate {
  std::string name;
  bool feasible = false;
  std::string why;  // when infeasible
  Plan plan;
  SimResult sim;
};

struct PlanOutcome {
  bool feasible = false;
  // "does not fit: <tier> short by <bytes> (needs ..., has ...)[; it fits with <change>]"
  std::string why;
  Plan plan;
  SimResult sim;
  Instance inst;
  std::vector<Candidate> candidates;  // dp, heuristics, milp (those that ran)
  std::optional<MilpSolution> milp;
  std::optional<DpResult> dp;
  std::string chosen;  // which candidate became the plan
  int64_t eight_bit_tensors = 0, eight_bit_params = 0;
  StatePlacement placement;  // also in plan.placement
  StateBytes state;          // bytes and home of each part of the model state
  double flops_per_step = 0;  // 6 * N * batch * seq
  // + the sequence mixers (model_flops_with_attention), every row's causal square times PlanRequest::attention_fraction
  double flops_attn_per_step = 0;
  // Moments on the NVMe tier (placement.nvme_layers > 0): the disk's busy time per step for them (every read and
  // write-back, Instance::nvme_io_s) and what they add to the predicted step: the plan simulated as is against the
  // same plan with that I/O taking no time.
  double nvme_moments_io_s = 0, nvme_moments_cost_s = 0;
};

// Tensors switched to 8-bit moments for the request's optimizer mode: none (adamw), every eligible
// matrix (adamw8bit: layer matrices and an untied LM head, as the optimizer's own rule), or the fewest
// largest of them until the model state (with placement s) fits the DRAM budget (hybrid). Norms and
// biases keep fp32 moments; the input embedding too unless s.embedding_8bit.
std::vector<std::string> choose_8bit(const ModelConfig& c, const std::string& mode, double dram_budget,
                                     StatePlacement s = {});

PlanOutcome make_plan(const PlanRequest& r);

// Largest batch in [1, hi] for which `planner` (a heuristic name, or "dp"/"milp" meaning the DP's
// space) finds a feasible plan; 0 if none. Feasibility is monotone in the batch (memory grows with it).
// Without kept internals (keep_internals = false): keeping only adds HBM, so it never changes feasibility.
int64_t max_feasible_batch(PlanRequest r, const std::string& planner, int64_t hi = 4096);

// Longest sequence, a multiple of `granule` tokens in [granule, hi], for which `planner` (as for
// max_feasible_batch) finds a feasible plan at r.batch; 0 if none. Feasibility is monotone in the sequence length
// (every boundary, internal and workspace grows with it). Without kept internals, as max_feasible_batch.
int64_t max_feasible_seq(PlanRequest r, const std::string& planner, int64_t granule = 1024,
                         int64_t hi = int64_t(1) << 24);

}  // namespace lt
