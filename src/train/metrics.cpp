#include "train/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/timer.h"
#include "core/units.h"
#include "model/accounting.h"

namespace lt::train {

FlopModel flop_model(const ModelConfig& c, int64_t batch, int64_t seq, int64_t micro_batches,
                     double extra_layer_forwards) {
  FlopModel f;
  const int64_t tokens = batch * seq;
  f.model_flops = model_flops_per_step(c, tokens * micro_batches);
  f.model_flops_attn = model_flops_with_attention(c, full_rows(batch * micro_batches, seq));
  const LayersFlops lf = all_layers_flops(c, batch, seq);
  // Extra forwards are counted at the mean layer's forward (hybrid models: kinds differ by a few %).
  const double mean_fwd = lf.fwd / double(c.layers);
  // Head: forward GEMM + two backward GEMMs (dX and dW).
  double per_mb = lf.fwd + lf.bwd + extra_layer_forwards * mean_fwd + 3.0 * head_flops_fwd(c, tokens);
  f.hardware_flops = per_mb * double(micro_batches);
  return f;
}

void fill_throughput(StepMetrics& m, const FlopModel& f, double peak_tflops) {
  if (m.step_time <= 0) return;
  m.tflops = f.model_flops / m.step_time / 1e12;
  m.tflops_attn = f.model_flops_attn / m.step_time / 1e12;
  m.hfu_tflops = f.hardware_flops / m.step_time / 1e12;
  if (peak_tflops > 0) {
    m.mfu = m.tflops / peak_tflops;
    m.mfu_attn = m.tflops_attn / peak_tflops;
    m.hfu = m.hfu_tflops / peak_tflops;
  }
}

static int64_t proc_status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::atoll(line.c_str() + n + 1);
    }
  }
  return 0;
}

int64_t host_peak_rss_bytes() { return proc_status_kb("VmHWM") * 1024; }
int64_t host_rss_bytes() { return proc_status_kb("VmRSS") * 1024; }

double device_peak_tflops(const std::string& name) {
  // Dense bf16 tensor-core peaks from the vendors' data sheets (no sparsity).
  struct P { const char* key; double tflops; };
  static const P table[] = {{"H100", 989}, {"H200", 989}, {"H800", 989}, {"H20", 148},
                            {"A100", 312}, {"A800", 312}, {"L40S", 362}, {"4090", 165},
                            {"3090", 71},  {"A6000", 155}};
  for (const auto& p : table)
    if (name.find(p.key) != std::string::npos) return p.tflops;
  return 0;
}

static std::string fmt_time(double s) {
  if (s < 0 || !std::isfinite(s)) return "?";
  int64_t t = static_cast<int64_t>(std::llround(s));
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{:.1f}s", s);
}

std::string format_console_line(const StepMetrics& m) {
  std::string s = fmt::format("step {}/{} | epoch {:.2f} | loss {:.4f} | grad_norm {:.3f} | lr {:.3e} | {:.3f} s/step | "
                              "{:.0f} tok/s ({:.0f} non-pad) | {:.3f} TFLOPS ({:.3f} with attention)",
                              m.step, m.total_steps, m.epoch, m.loss, m.grad_norm, m.lr, m.step_time,
                              m.step_time > 0 ? double(m.tokens) / m.step_time : 0.0,
                              m.step_time > 0 ? double(m.nonpad_tokens) / m.step_time : 0.0, m.tflops, m.tflops_attn);
  if (m.mfu > 0)
    s += fmt::format(" | MFU {:.1f}% ({:.1f}% with attention) HFU {:.1f}%", 100 * m.mfu, 100 * m.mfu_attn, 100 * m.hfu);
  if (m.peak_gpu_bytes >= 0) s += fmt::format(" | gpu peak {}", format_bytes(double(m.peak_gpu_bytes)));
  s += fmt::format(" | host rss {}", format_bytes(double(m.host_rss_bytes)));
  if (m.exposed_transfer_s >= 0) {
    s += fmt::format(" | exposed xfer {:.1f} ms", 1e3 * m.exposed_transfer_s);
    if (m.exposed_transfer_pred_s >= 0) s += fmt::format(" (pred {:.1f})", 1e3 * m.exposed_transfer_pred_s);
  }
  if (m.exposed_optimizer_s >= 0) {
    s += fmt::format(" | exposed optim {:.1f} ms", 1e3 * m.exposed_optimizer_s);
    if (m.exposed_optimizer_pred_s >= 0) s += fmt::format(" (pred {:.1f})", 1e3 * m.exposed_optimizer_pred_s);
  }
  if (m.optimizer_params_per_s > 0) {
    s += fmt::format(" | optim rate {:.0f} Mparams/s", 1e-6 * m.optimizer_params_per_s);
    if (m.optimizer_params_per_s_profile > 0) s += fmt::format(" (profile {:.0f})", 1e-6 * m.optimizer_params_per_s_profile);
  }
  if (m.breakdown.valid) s += "\n" + format_breakdown(m.breakdown);
  return s;
}

std::string to_json_line(const StepMetrics& m) {
  nlohmann::json j = {{"type", "train"},
                      {"step", m.step},
                      {"total_steps", m.total_steps},
                      {"epoch", m.epoch},
                      {"loss", m.loss},
                      {"grad_norm", m.grad_norm},
                      {"lr", m.lr},
                      {"step_time_s", m.step_time},
                      {"tokens", m.tokens},
                      {"nonpad_tokens", m.nonpad_tokens},
                      {"loss_tokens", m.loss_tokens},
                      {"tokens_per_s", m.step_time > 0 ? double(m.tokens) / m.step_time : 0.0},
                      {"nonpad_tokens_per_s", m.step_time > 0 ? double(m.nonpad_tokens) / m.step_time : 0.0},
                      {"tflops", m.tflops},
                      {"tflops_attn", m.tflops_attn},
                      {"hfu_tflops", m.hfu_tflops},
                      {"mfu", m.mfu},
                      {"mfu_attn", m.mfu_attn},
                      {"hfu", m.hfu},
                      {"host_peak_rss_bytes", m.host_rss_bytes}};
  if (m.update_skipped) j["update_skipped"] = true;
  if (m.skipped_steps > 0) j["skipped_steps"] = m.skipped_steps;
  if (m.peak_gpu_bytes >= 0) j["peak_gpu_bytes"] = m.peak_gpu_bytes;
  if (m.exposed_transfer_s >= 0) j["exposed_transfer_s"] = m.exposed_transfer_s;
  if (m.exposed_transfer_pred_s >= 0) j["exposed_transfer_pred_s"] = m.exposed_transfer_pred_s;
  if (m.exposed_optimizer_s >= 0) j["exposed_optimizer_s"] = m.exposed_optimizer_s;
  if (m.exposed_optimizer_pred_s >= 0) j["exposed_optimizer_pred_s"] = m.exposed_optimizer_pred_s;
  if (m.optimizer_wait_s >= 0) j["optimizer_wait_s"] = m.optimizer_wait_s;
  if (m.optimizer_params_per_s > 0) j["optimizer_params_per_s"] = m.optimizer_params_per_s;
  if (m.optimizer_params_per_s_profile > 0) j["optimizer_params_per_s_profile"] = m.optimizer_params_per_s_profile;
  if (m.breakdown.valid) j["breakdown"] = breakdown_json(m.breakdown);
  for (size_t r = 0; r < m.ranks.size(); ++r) {
    const RankFigures& f = m.ranks[r];
    j["ranks"].push_back({{"rank", r},
                          {"step_time_s", f.step_time},
                          {"tokens", f.tokens},
                          {"loss_tokens", f.loss_tokens},
                          {"host_peak_rss_bytes", f.host_rss_bytes},
                          {"comm_s", f.comm_s}});
  }
  return j.dump();
}

MetricsLogger::MetricsLogger(const std::filesystem::path& jsonl_path, bool progress_bar, bool append) {
  if (!jsonl_path.empty()) {
    file_ = std::fopen(jsonl_path.c_str(), append ? "a" : "w");
    LT_CHECK(file_, "cannot open metrics file '{}' for writing", jsonl_path.string());
  }
  tty_ = progress_bar && isatty(STDOUT_FILENO);
  start_time_ = now_seconds();
}

MetricsLogger::~MetricsLogger() {
  finish();
  if (file_) std::fclose(file_);
}

void MetricsLogger::clear_bar() {
  if (bar_shown_) {
    std::fputs("\r\033[2K", stdout);
    bar_shown_ = false;
  }
}

void MetricsLogger::message(const std::string& text) {
  if (muted_) return;
  clear_bar();
  std::fputs(text.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void MetricsLogger::log(const StepMetrics& m) {
  message(format_console_line(m));
  event(to_json_line(m));
}

void MetricsLogger::event(const std::string& json_line) {
  if (!file_) return;
  std::fputs(json_line.c_str(), file_);
  std::fputc('\n', file_);
  std::fflush(file_);
}

void MetricsLogger::progress(int64_t step, int64_t total, double loss) {
  if (!tty_) return;
  double now = now_seconds();
  if (start_step_ < 0) {  // ETA from the rate since the first step seen (resume-aware)
    start_step_ = step;
    start_time_ = now;
  }
  double rate = step > start_step_ ? (now - start_time_) / double(step - start_step_) : -1;
  double eta = rate > 0 ? rate * double(total - step) : -1;
  const int width = 30;
  int filled = total > 0 ? int(width * std::min<int64_t>(step, total) / total) : 0;
  std::string bar(size_t(filled), '#');
  bar.resize(width, '.');
  std::fprintf(stdout, "\r\033[2K[%s] %lld/%lld loss %.4f  %s/step  ETA %s", bar.c_str(), (long long)step,
               (long long)total, loss, fmt_time(rate).c_str(), fmt_time(eta).c_str());
  std::fflush(stdout);
  bar_shown_ = true;
}

void MetricsLogger::finish() { clear_bar(); }

}  // namespace lt::train
