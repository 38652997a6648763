#include "train/planning.h"

#include <cmath>

#include "core/error.h"
#include "core/units.h"
#include "model/accounting.h"

namespace lt::train {

TrainingPlan make_training_plan(const TrainConfig& cfg, const ModelConfig& model, int64_t batch, int64_t seq,
                                const std::string& device_name, bool on_gpu) {
  TrainingPlan tp;
  tp.exec = ExecPlan::keep_all(model.layers, batch, seq);
  tp.planner = "all-gpu";
  tp.device_budget = cfg.gpu_mem.empty() ? -1 : parse_bytes(cfg.gpu_mem);
  tp.host_budget = cfg.host_mem.empty() ? -1 : parse_bytes(cfg.host_mem);
  tp.extra_layer_forwards = double(model.layers);
  if (cfg.optimizer == "adamw8bit") {
  }
  tp.summary = fmt::format("plan ({}): {}\n", tp.planner, describe_plan(tp.exec));
  (void)device_name;
  (void)on_gpu;
  return tp;
}

}  // namespace lt::train
