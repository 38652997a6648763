// Discrete-event simulation of one training step of a Plan on an Instance (docs/planner.md, "Simulator").
// Lanes: GPU compute, H2D, D2H, NVMe read, NVMe write, CPU optimizer. Events happen at slot
// boundaries (barrier rule, instance.h); PCIe directions share the both-ways bandwidth with rates
// proportional to the bytes left, so concurrent H2D and D2H of a slot finish together at
// max(h/h2d, d/d2h, (h+d)/both). The optimizer lane runs layer 0..L-1, head, embedding from the step's
// start; slot F_{j-1} (which streams layer j's weights) waits for layer j's update.
#pragma once
#include <string>
#include <vector>

#include "plan/instance.h"
#include "plan/plan.h"

namespace lt {

enum class SimLane : int { Compute = 0, H2D, D2H, NvmeRead, NvmeWrite, Optimizer, Count };
const char* sim_lane_name(SimLane l);

struct SimOp {
  SimLane lane;
  double t0 = 0, t1 = 0;
  std::string label;
  bool exposed = false;  // compute lane: time the GPU waited
  int kind = -1;         // compute lane: LayerKind of the slot's layer (-1: not a layer slot)
};

struct SlotTraffic {
  double C = 0, recompute = 0, h = 0, d = 0, r = 0, w = 0;  // compute s, bytes per lane
};

struct SimResult {
  PlanPrediction pred;
  double step_no_opt_s = 0;         // the step if the optimizer never delayed anything (DP objective)
  std::vector<SlotTraffic> slots;   // per slot (instance.h numbering)
  std::vector<double> slot_start, slot_time, slot_hbm;
  double dram = 0, nvme = 0;
  bool fits = true;
  std::string violation;            // "does not fit: <tier> short by <bytes> (needs ..., has ...)" when !fits
  std::vector<SimOp> ops;          // for the SVG timeline
};

// Per-slot traffic of a plan (compute, mandatory and checkpoint bytes).
std::vector<SlotTraffic> plan_slot_traffic(const Instance& in, const Plan& p);
// Display name of slot w: "F3", "H", "B3" (with " A" / " D" for the layer kind when kinds are mixed).
std::string slot_name(const Instance& in, int w);
// Slot of each plan window (plan_windows order).
std::vector<int> window_slots(const Instance& in, const Plan& p);

SimResult simulate(const Instance& in, const Plan& p, bool record_ops = false);

}  // namespace lt
