// Instrumentation: per-window measured figures, Chrome trace, memory and window tables.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "core/units.h"
#include "exec/executor_impl.h"

namespace lt {

std::vector<WindowStats> Executor::Impl::window_stats(int32_t mb, double t_mb0) const {
  const size_t nw = wins.size();
  std::vector<double> busy(nw, 0), end(nw, -1), embed(nw, 0);
  std::vector<TraceSpan> spans;
  {
    std::lock_guard<std::mutex> g(const_cast<std::mutex&>(trace_mu));
    for (auto& s : trace)
      if (s.micro_batch == mb) spans.push_back(s);
  }
  std::vector<std::vector<std::pair<double, double>>> runs(nw);  // compute intervals per window
  std::vector<std::pair<double, double>> opt_waits;               // host blocked on an optimizer update
  for (auto& s : spans) {
    if (s.track == int(Lane::Compute) && s.label.window >= 0 && size_t(s.label.window) < nw) {
      busy[size_t(s.label.window)] += s.t1 - s.t0;
      if (std::string_view(s.label.what).starts_with(kEmbedLabelPrefix))
        embed[size_t(s.label.window)] += s.t1 - s.t0;
      end[size_t(s.label.window)] = std::max(end[size_t(s.label.window)], s.t1);
      runs[size_t(s.label.window)].emplace_back(s.t0, s.t1);
    }
    if (s.track == kTrackHost && std::string_view(s.label.what) == kOptimizerWaitLabel) opt_waits.emplace_back(s.t0, s.t1);
  }
  // Time of [a, b) covered by the optimizer waits.
  auto opt_overlap = [&](double a, double b) {
    double t = 0;
    for (auto [w0, w1] : opt_waits) t += std::max(0.0, std::min(b, w1) - std::max(a, w0));
    return t;
  };
  std::vector<WindowStats> out(nw);
  double prev = t_mb0;
  for (size_t w = 0; w < nw; ++w) {
    WindowStats& ws = out[w];
    ws.index = int32_t(w);
    ws.ref = wins[w];
    const double e = end[w] >= 0 ? end[w] : prev;
    ws.t_begin = prev - trace_t0;
    ws.t_end = e - trace_t0;
    ws.measured.compute = busy[w];
    ws.measured.embedding = embed[w];
    ws.measured.exposed = std::max(0.0, (e - prev) - busy[w]);
    // The compute lane's idle gaps in [prev, e); the parts that overlap an optimizer wait are charged to
    // the optimizer (waits on one thread never overlap each other).
    auto& rw = runs[w];
    std::sort(rw.begin(), rw.end());
    double cursor = prev, idle_opt = 0;
    for (auto [r0, r1] : rw) {
      if (r0 > cursor) idle_opt += opt_overlap(cursor, std::min(r0, e));
      cursor = std::max(cursor, r1);
    }
    if (cursor < e) idle_opt += opt_overlap(cursor, e);
    ws.measured.exposed_optimizer = std::min(idle_opt, ws.measured.exposed);
    for (auto& s : spans) {
      const double ov = std::max(0.0, std::min(s.t1, e) - std::max(s.t0, prev));
      if (ov <= 0) continue;
      switch (s.track) {
        case int(Lane::H2D): ws.measured.h2d += ov; break;
        case int(Lane::D2H): ws.measured.d2h += ov; break;
        case kTrackNvmeRead: ws.measured.nvme_read += ov; break;
        case kTrackNvmeWrite: ws.measured.nvme_write += ov; break;
        default: break;
      }
    }
    if (!P.predicted.empty()) ws.predicted = P.predicted[w];
    prev = e;
  }
  return out;
}

void Executor::write_trace(const std::filesystem::path& path) const {
  static const char* names[kNumTracks] = {"compute", "h2d", "d2h", "nvme read", "nvme write", "host", "windows"};
  nlohmann::json ev = nlohmann::json::array();
  for (int t = 0; t < kNumTracks; ++t)
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", t}, {"args", {{"name", names[t]}}}});
  std::vector<TraceSpan> spans;
  {
    std::lock_guard<std::mutex> g(impl_->trace_mu);
    spans = impl_->trace;
  }
  for (auto& s : spans) {
    nlohmann::json args = {{"window", s.label.window}, {"index", s.label.index}, {"micro_batch", s.micro_batch}};
    if (s.bytes) args["bytes"] = s.bytes;
    std::string name = s.label.what;
    if (s.label.index >= 0) name += fmt::format(" {}", s.label.index);
    ev.push_back({{"name", name},
                  {"cat", names[s.track]},
                  {"ph", "X"},
                  {"pid", 0},
                  {"tid", s.track},
                  {"ts", (s.t0 - impl_->trace_t0) * 1e6},
                  {"dur", (s.t1 - s.t0) * 1e6},
                  {"args", args}});
  }
  // The windows themselves, as a track: "F3", "H", "R1", "B0" with measured and predicted figures.
  for (size_t m = 0; m < impl_->trace_windows.size(); ++m)
    for (auto& w : impl_->trace_windows[m]) {
      const char k = w.ref.kind == WindowKind::Forward ? 'F' : w.ref.kind == WindowKind::Head ? 'H'
                     : w.ref.kind == WindowKind::Recompute ? 'R' : 'B';
      const std::string name = w.ref.layer >= 0 ? fmt::format("{}{}", k, w.ref.layer) : std::string(1, k);
      ev.push_back({{"name", name},
                    {"cat", "windows"},
                    {"ph", "X"},
                    {"pid", 0},
                    {"tid", int(kTrackWindows)},
                    {"ts", w.t_begin * 1e6},
                    {"dur", (w.t_end - w.t_begin) * 1e6},
                    {"args",
                     {{"window", w.index},
                      {"micro_batch", m},
                      {"exposed_ms", w.measured.exposed * 1e3},
                      {"predicted_exposed_ms", w.predicted.exposed * 1e3},
                      {"compute_ms", w.measured.compute * 1e3}}}});
    }
  std::ofstream f(path);
  LT_CHECK(f.good(), "trace: cannot write {}", path.string());
  f << nlohmann::json{{"traceEvents", ev}, {"displayTimeUnit", "ms"}}.dump();
  LT_CHECK(f.good(), "trace: write to {} failed", path.string());
}

std::string Executor::memory_table() const {
  std::string s = be_.memory().table();
  if (impl_->store)
    s += fmt::format("nvme     {:<24} {:>6} {:>12}\n", impl_->store->dir().string(), nvme_files_live(), "");
  return s;
}

std::string Executor::window_table(const StepResult& r) const {
  std::string s = fmt::format("{:>4} {:<10} {:>5} | {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} | {:>9} {:>9}\n", "win",
                              "kind", "layer", "compute", "h2d", "d2h", "nvme_rd", "nvme_wr", "exposed", "exp_optim",
                              "pred_cmp", "pred_exp");
  auto ms = [](double x) { return fmt::format("{:.3f}", x * 1e3); };
  for (auto& w : r.windows)
    s += fmt::format("{:>4} {:<10} {:>5} | {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} | {:>9} {:>9}\n", w.index,
                     window_kind_name(w.ref.kind), w.ref.layer, ms(w.measured.compute), ms(w.measured.h2d),
                     ms(w.measured.d2h), ms(w.measured.nvme_read), ms(w.measured.nvme_write), ms(w.measured.exposed),
                     ms(w.measured.exposed_optimizer), ms(w.predicted.compute), ms(w.predicted.exposed));
  s += fmt::format("(ms) step {:.3f}  exposed measured {:.3f} (of which optimizer {:.3f})  predicted {:.3f}\n",
                   r.step_s * 1e3, r.exposed_s * 1e3, r.exposed_optimizer_s * 1e3, r.predicted_exposed_s * 1e3);
  return s;
}

}  // namespace lt
