// Where one optimizer step's wall time went, measured beside the plan's prediction, from the
// executor's per-window figures:
//   layers      compute of the decoder layers' forward and backward windows, the embedding's ops excepted
//   embedding   the embedding's lookup and backward on the device (in window 0 and the last backward window;
//               not modelled by the planner: predicted 0)
//   recompute   compute of the recompute windows (blocks regenerating dropped boundaries)
//   head        the head window: final norm, LM head and loss, forward and backward
//   exposed transfer / exposed optimizer   compute waiting for transfers / for the CPU optimizer
//   host gaps   the rest of the step: the compute lane idle without waiting for a transfer or an update
//               (kernel launch gaps, synchronisations, host-side work between windows)
// Per-window figures are the last micro-batch's; with several micro-batches they are scaled by their count.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "exec/executor.h"

namespace lt::train {

struct TimeSplit {
  double layers = 0, embedding = 0, recompute = 0, head = 0, exposed_transfer = 0, exposed_optimizer = 0, gaps = 0,
         step = 0;
};

struct StepBreakdown {
  bool valid = false;
  TimeSplit measured, predicted;  // predicted: from the plan (gaps 0; step = the planner's step time)
};

StepBreakdown step_breakdown(const StepResult& r, int64_t micro_batches, double step_s, double predicted_step_s,
                             double predicted_exposed_transfer_s, double predicted_exposed_optimizer_s);
// "time: layers 2941 ms (pred 2980) | embedding 4 (-) | recompute 0 (0) | head+loss 310 (298) | ..."
std::string format_breakdown(const StepBreakdown& b);
nlohmann::json breakdown_json(const StepBreakdown& b);

}  // namespace lt::train
