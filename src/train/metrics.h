// Training metrics (definitions in docs/metrics.md): throughput (TFLOPS as the paper and MegaTrain
// report it, MFU, HFU), tokens/s, memory peaks, exposed transfer/optimizer time; one console line per
// logging step, a progress bar with ETA on a terminal, and a JSONL file in output_dir.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "train/step_breakdown.h"

#include "model/model_config.h"

namespace lt::train {

// One rank's part of a data-parallel step (metrics.jsonl "ranks"; data_parallel.h).
struct RankFigures {
  double step_time = 0;        // this rank's executor step, seconds
  int64_t tokens = 0;          // batch x seq over its micro-batches
  int64_t loss_tokens = 0;
  int64_t host_rss_bytes = 0;  // VmHWM of its process
  double comm_s = 0;           // time in collectives during the step
};

struct StepMetrics {
  int64_t step = 0;          // optimizer steps done (1-based after the first)
  int64_t total_steps = 0;
  double epoch = 0;          // fractional epoch
  double loss = 0;           // mean over loss tokens of the optimizer step
  double grad_norm = 0;      // global L2 norm before clipping
  bool update_skipped = false;   // non-finite gradient norm: the optimizer skipped this step's update
  int64_t skipped_steps = 0;     // such steps so far in the training (resumed runs included)
  double lr = 0;
  double step_time = 0;      // seconds, wall clock of the whole optimizer step
  int64_t tokens = 0;        // batch x seq summed over micro-batches (padding included)
  int64_t nonpad_tokens = 0; // tokens that are not padding
  int64_t loss_tokens = 0;   // tokens that carry loss
  double tflops = 0;         // 6 N tokens / step_time / 1e12
  double tflops_attn = 0;    // (6 N tokens + sequence mixers: causal attention per segment) / step_time / 1e12
  double hfu_tflops = 0;     // hardware FLOPs (recompute + attention included) / step_time / 1e12
  double mfu = 0;            // tflops / peak
  double mfu_attn = 0;       // tflops_attn / peak
  double hfu = 0;            // hfu_tflops / peak
  int64_t peak_gpu_bytes = -1;   // -1 when not on a GPU
  int64_t host_rss_bytes = 0;    // VmHWM
  // Compute-lane idle time, split by cause (executor instrumentation): waiting for transfers, and
  // waiting while the host was blocked on a unit's CPU optimizer update. -1: not available.
  double exposed_transfer_s = -1, exposed_transfer_pred_s = -1;
  double exposed_optimizer_s = -1, exposed_optimizer_pred_s = -1;
  double optimizer_wait_s = -1;  // host time blocked on optimizer updates (may overlap queued GPU work)
  // The CPU optimizer's achieved rate over this step's interval (parameters updated / worker time per thread), beside
  // the rate the profile measured at start, which the planner's exposed-optimizer prediction uses. -1: none updated.
  double optimizer_params_per_s = -1, optimizer_params_per_s_profile = -1;
  StepBreakdown breakdown;        // where the step's time went (step_breakdown.h)
  std::vector<RankFigures> ranks;  // data parallel: every rank's figures, by rank (empty: one process)
};

// FLOP counts for one optimizer step of `tokens` tokens (batch x seq x micro-batches).
struct FlopModel {
  double model_flops = 0;       // 6 N tokens
  double model_flops_attn = 0;  // 6 N tokens + sequence mixers (model_flops_with_attention), rows one segment each
  double hardware_flops = 0;    // per-layer fwd+bwd (attention included) + extra forwards + head
};
// extra_layer_forwards: layer forwards run beyond one per layer per micro-batch pass, per
// micro-batch (recompute blocks + a layer backward's recompute of its own internals).
FlopModel flop_model(const ModelConfig& c, int64_t batch, int64_t seq, int64_t micro_batches,
                     double extra_layer_forwards);

// Fills tflops/tflops_attn/hfu_tflops/mfu/mfu_attn/hfu from the FLOP model, step_time and the peak (TFLOP/s;
// <= 0 skips MFU/HFU).
void fill_throughput(StepMetrics& m, const FlopModel& f, double peak_tflops);

// Peak resident set size of this process (VmHWM from /proc/self/status), bytes; 0 if unreadable.
int64_t host_peak_rss_bytes();
// Current resident set size (VmRSS).
int64_t host_rss_bytes();

// Dense bf16 peak TFLOP/s for a device name ("NVIDIA H200" -> 989); 0 when unknown.
double device_peak_tflops(const std::string& device_name);

std::string format_console_line(const StepMetrics& m);
std::string to_json_line(const StepMetrics& m);

// Writes console lines, the JSONL file and (on a TTY) a progress bar with ETA.
class MetricsLogger {
 public:
  MetricsLogger(const std::filesystem::path& jsonl_path, bool progress_bar, bool append);
  ~MetricsLogger();
  void log(const StepMetrics& m);                     // a logging step: console line + JSONL
  void progress(int64_t step, int64_t total, double loss);  // every step: redraw the bar (TTY only)
  void event(const std::string& json_line);           // any other record (eval, checkpoint) to JSONL
  void message(const std::string& text);              // console text, clearing the bar first
  void finish();
  void mute_console() { muted_ = true; }  // data-parallel ranks other than 0: no console output

 private:
  void clear_bar();
  std::FILE* file_ = nullptr;
  bool tty_ = false;
  bool bar_shown_ = false;
  bool muted_ = false;
  double start_time_ = 0;
  int64_t start_step_ = -1;
};

}  // namespace lt::train
