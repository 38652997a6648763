#include "train/step_breakdown.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace lt::train {

namespace {

// Compute time of the windows by kind (the figures of one micro-batch).
void add_windows(const StepResult& r, bool predicted, TimeSplit& t) {
  for (const WindowStats& w : r.windows) {
    const double c = predicted ? w.predicted.compute : w.measured.compute;
    const double e = predicted ? w.predicted.embedding : w.measured.embedding;
    switch (w.ref.kind) {
      case WindowKind::Forward:
      case WindowKind::Backward:
        t.layers += c - e;
        t.embedding += e;
        break;
      case WindowKind::Recompute: t.recompute += c; break;
      case WindowKind::Head: t.head += c; break;
    }
  }
}

void scale(TimeSplit& t, double k) {
  t.layers *= k;
  t.embedding *= k;
  t.recompute *= k;
  t.head *= k;
}

}  // namespace

StepBreakdown step_breakdown(const StepResult& r, int64_t micro_batches, double step_s, double predicted_step_s,
                             double predicted_exposed_transfer_s, double predicted_exposed_optimizer_s) {
  StepBreakdown b;
  if (r.windows.empty()) return b;
  b.valid = true;
  const double k = double(std::max<int64_t>(1, micro_batches));
  TimeSplit& m = b.measured;
  add_windows(r, false, m);
  scale(m, k);
  m.exposed_optimizer = r.exposed_optimizer_s;
  m.exposed_transfer = std::max(0.0, r.exposed_s - r.exposed_optimizer_s);
  m.step = step_s;
  m.gaps = std::max(0.0, step_s - (m.layers + m.embedding + m.recompute + m.head + m.exposed_transfer +
                                    m.exposed_optimizer));
  TimeSplit& p = b.predicted;
  add_windows(r, true, p);
  scale(p, k);
  p.exposed_transfer = std::max(0.0, predicted_exposed_transfer_s);
  p.exposed_optimizer = std::max(0.0, predicted_exposed_optimizer_s);
  p.step = predicted_step_s;
  return b;
}

std::string format_breakdown(const StepBreakdown& b) {
  if (!b.valid) return {};
  const TimeSplit &m = b.measured, &p = b.predicted;
  auto ms = [](double s) { return fmt::format("{:.0f}", 1e3 * s); };
  return fmt::format("  time: layers {} ms (pred {}) | embedding {} (-) | recompute {} ({}) | head+loss {} ({}) | "
                     "exposed xfer {} ({}) | exposed optim {} ({}) | host gaps {} | step {} ({})",
                     ms(m.layers), ms(p.layers), ms(m.embedding), ms(m.recompute), ms(p.recompute), ms(m.head), ms(p.head),
                     ms(m.exposed_transfer), ms(p.exposed_transfer), ms(m.exposed_optimizer), ms(p.exposed_optimizer),
                     ms(m.gaps), ms(m.step), ms(p.step));
}

nlohmann::json breakdown_json(const StepBreakdown& b) {
  auto split = [](const TimeSplit& t) {
    return nlohmann::json{{"layers_s", t.layers},
                          {"embedding_s", t.embedding},
                          {"recompute_s", t.recompute},
                          {"head_s", t.head},
                          {"exposed_transfer_s", t.exposed_transfer},
                          {"exposed_optimizer_s", t.exposed_optimizer},
                          {"host_gaps_s", t.gaps},
                          {"step_s", t.step}};
  };
  return {{"measured", split(b.measured)}, {"predicted", split(b.predicted)}};
}

}  // namespace lt::train
