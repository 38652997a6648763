#include "train/nonfinite.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "exec/host_state.h"
#include "model/param_layout.h"

namespace lt::train {
namespace {

// A piece of one tensor's master, the unit of work of the scan.
struct ScanPiece {
  int64_t unit = 0, tensor = 0;  // tensor: ordinal in layout order over all units
  int64_t offset = 0, count = 0;  // elements of the unit's flat buffer
};

constexpr int64_t kScanChunk = int64_t(1) << 20;  // elements per piece (4 MiB of fp32 per thread)

std::vector<ScanPiece> scan_pieces(const ModelLayout& layout, std::vector<const ParamInfo*>& tensors) {
  std::vector<ScanPiece> pieces;
  for (size_t u = 0; u < layout.units.size(); ++u)
    for (const ParamInfo& p : layout.units[u].params) {
      const int64_t t = int64_t(tensors.size());
      tensors.push_back(&p);
      for (int64_t o = 0; o < p.numel; o += kScanChunk)
        pieces.push_back({int64_t(u), t, p.offset + o, std::min(kScanChunk, p.numel - o)});
    }
  return pieces;
}

std::string plural(int64_t n, const char* one, const char* many) { return fmt::format("{} {}", n, n == 1 ? one : many); }

// "the head", "layer 3", "the embedding".
std::string unit_name(const ModelLayout& layout, int u) {
  const UnitLayout& ul = layout.units[size_t(u)];
  switch (ul.kind) {
    case UnitKind::Embedding: return "the embedding";
    case UnitKind::Head: return "the head";
    case UnitKind::Layer: break;
  }
  return fmt::format("layer {}", ul.layer);
}

// The units in backward order (the head first, the embedding last), runs of layers joined: "the head, layers 3..0,
// the embedding".
std::string units_backward(const ModelLayout& layout, std::vector<int> units) {
  std::sort(units.rbegin(), units.rend());
  std::vector<std::string> parts;
  for (size_t i = 0; i < units.size();) {
    size_t j = i;
    const auto layer_at = [&](size_t k) { return layout.units[size_t(units[k])].kind == UnitKind::Layer; };
    if (!layer_at(i)) {
      parts.push_back(unit_name(layout, units[i]));
      ++i;
      continue;
    }
    while (j + 1 < units.size() && layer_at(j + 1) && units[j + 1] == units[j] - 1) ++j;
    const int64_t hi = layout.units[size_t(units[i])].layer, lo = layout.units[size_t(units[j])].layer;
    parts.push_back(hi == lo ? fmt::format("layer {}", hi) : fmt::format("layers {}..{}", hi, lo));
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

// A norm or loss for messages: "nan" whatever the sign bit (fmt writes "-nan" for a negative NaN).
std::string value_text(double x, bool short_form) {
  if (std::isnan(x)) return "nan";
  return short_form ? fmt::format("{:.4g}", x) : fmt::format("{}", x);
}

std::string steps_range(int64_t first, int64_t last) {
  return first == last ? fmt::format("step {}", first) : fmt::format("steps {}..{}", first, last);
}

// Why a streak stopped training: "reaching max_skipped_steps (3)"; with 0, which stops at the first non-finite step
// as 1 does, "reaching max_skipped_steps (0: the first one stops training)".
std::string limit_reached(int64_t max_skipped_steps) {
  return max_skipped_steps > 0 ? fmt::format("reaching max_skipped_steps ({})", max_skipped_steps)
                               : fmt::format("reaching max_skipped_steps ({}: the first one stops training)",
                                             max_skipped_steps);
}

const char* streak_what(const NonFiniteStop& s) {
  return s.all_skipped ? "a non-finite gradient norm" : "a non-finite loss or gradient norm";
}

}  // namespace

namespace {

// Runs visit(piece index, piece, its fp32 master values) over the pieces on `threads` threads (0: all cores), each
// piece once unless skip(piece) says it is not needed any more.
template <class Skip, class Visit>
void scan_masters(const HostState& st, const std::vector<ScanPiece>& pieces, int threads, Skip skip, Visit visit) {
  std::atomic<size_t> next{0};
  const auto work = [&] {
    std::vector<float> buf(static_cast<size_t>(kScanChunk));
    for (size_t i; (i = next.fetch_add(1)) < pieces.size();) {
      const ScanPiece& p = pieces[i];
      if (skip(p)) continue;
      st.read_master(p.unit, p.offset, p.count, buf.data());
      visit(i, p, buf.data());
    }
  };
  const int n = std::max(1, std::min(threads > 0 ? threads : int(std::thread::hardware_concurrency()),
                                     int(pieces.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

}  // namespace

std::optional<NonFiniteParameter> first_nonfinite_parameter(const HostState& st, const ModelLayout& layout,
                                                            int threads) {
  std::vector<const ParamInfo*> tensors;
  const std::vector<ScanPiece> pieces = scan_pieces(layout, tensors);
  std::vector<int64_t> nan(pieces.size(), 0), inf(pieces.size(), 0);
  std::atomic<int64_t> first_bad{int64_t(tensors.size())};  // lowest tensor ordinal found bad so far
  const auto after_bad = [&](const ScanPiece& p) { return p.tensor > first_bad.load(); };  // a lower one is bad
  scan_masters(st, pieces, threads, after_bad, [&](size_t i, const ScanPiece& p, const float* x) {
    for (int64_t k = 0; k < p.count; ++k) {
      if (std::isnan(x[k])) ++nan[i];
      else if (std::isinf(x[k])) ++inf[i];
    }
    if (nan[i] + inf[i] == 0) return;
    int64_t seen = first_bad.load();
    while (p.tensor < seen && !first_bad.compare_exchange_weak(seen, p.tensor)) {
    }
  });
  const int64_t bad = first_bad.load();
  if (bad == int64_t(tensors.size())) return std::nullopt;
  NonFiniteParameter r;  // every piece of the first bad tensor was read: a piece is skipped only after a lower one
  r.name = tensors[size_t(bad)]->name;
  r.numel = tensors[size_t(bad)]->numel;
  for (size_t i = 0; i < pieces.size(); ++i)
    if (pieces[i].tensor == bad) r.nan += nan[i], r.inf += inf[i];
  return r;
}

LargestParameter largest_parameter(const HostState& st, const ModelLayout& layout, int threads) {
  std::vector<const ParamInfo*> tensors;
  const std::vector<ScanPiece> pieces = scan_pieces(layout, tensors);
  std::vector<float> top(pieces.size(), 0.0f);
  scan_masters(st, pieces, threads, [](const ScanPiece&) { return false; },
               [&](size_t i, const ScanPiece& p, const float* x) {
                 float m = 0;
                 for (int64_t k = 0; k < p.count; ++k) m = std::max(m, std::fabs(x[k]));
                 top[i] = m;
               });
  LargestParameter r;
  for (size_t i = 0; i < pieces.size(); ++i)
    if (top[i] > r.max_abs) r.max_abs = top[i], r.name = tensors[size_t(pieces[i].tensor)]->name;
  return r;
}

std::string first_nonfinite_text(const NonFiniteStep& s, const ModelLayout& layout) {
  if (s.parameter) {
    const NonFiniteParameter& p = *s.parameter;
    const char* what = p.nan && p.inf ? "NaN and Inf" : p.nan ? "NaN" : "Inf";
    return fmt::format("parameter {} ({} in the weights: {} of {} values)", p.name, what, p.nan + p.inf, p.numel);
  }
  const bool loss_finite = std::isfinite(s.loss);
  if (s.units.empty())
    return loss_finite ? "no single unit (every unit's gradient sum of squares is finite; their total overflowed)"
                       : "the forward pass (the loss is non-finite; the weights and the gradients are finite)";
  const int first = *std::max_element(s.units.begin(), s.units.end());
  return fmt::format("gradient of {}, the first in backward order (non-finite: {}); the loss is {}, so the {} pass "
                     "produced it{}",
                     unit_name(layout, first), units_backward(layout, s.units), loss_finite ? "finite" : "non-finite",
                     loss_finite ? "backward" : "forward", loss_finite ? "" : " (the weights are finite)");
}

std::string nonfinite_step_message(const NonFiniteStep& s, const ModelLayout& layout, int64_t in_a_row,
                                   int64_t max_skipped_steps) {
  if (!s.skipped)  // the norm was finite: the optimizer had applied the update before the loss was known
    return fmt::format("step {}: non-finite loss ({}) with a finite gradient norm ({}); first non-finite: {}; "
                       "update applied ({} non-finite in a row; max_skipped_steps {})",
                       s.step, value_text(s.loss, false), value_text(s.grad_norm, true),
                       first_nonfinite_text(s, layout), in_a_row, max_skipped_steps);
  return fmt::format("step {}: non-finite gradient norm ({}); loss {} ({}); first non-finite: {}; update skipped "
                     "({} in a row; max_skipped_steps {})",
                     s.step, value_text(s.grad_norm, false), value_text(s.loss, true),
                     std::isfinite(s.loss) ? "finite" : "non-finite", first_nonfinite_text(s, layout), in_a_row,
                     max_skipped_steps);
}

void NonFiniteStreak::record(int64_t step, bool nonfinite, bool skipped) {
  if (!nonfinite) {
    length_ = skipped_ = 0;
    return;
  }
  if (length_ == 0) first_ = step;
  ++length_;
  skipped_ += skipped;
}

std::string nonfinite_stop_message(const NonFiniteStop& s) {
  const int64_t n = s.step - s.first_step + 1;
  const std::string steps = steps_range(s.first_step, s.step);
  const char* what = streak_what(s);
  std::string head =
      s.run_ended
          ? fmt::format("training ended at step {} after {} in a row ({}) with {}; the final state is not saved",
                        s.step, plural(n, "step", "steps"), steps, what)
          : fmt::format("training stopped at step {}: {} in a row ({}) had {}, {}", s.step,
                        plural(n, "step", "steps"), steps, what, limit_reached(s.max_skipped_steps));
  std::string msg = fmt::format("{}; first non-finite (step {}): {}.\n", head, s.first_step, s.first_nonfinite);
  const int64_t good = s.first_step - 1;  // the last finite step
  const bool bad_source = s.in_weights && s.checkpoint_has_them;  // the last checkpoint, not a good one
  if (bad_source)
    msg += fmt::format("No checkpoint was written after step {}; the last checkpoint, {}, holds the non-finite "
                       "weights.\n",
                       good, s.last_checkpoint);
  else if (!s.last_checkpoint.empty())
    msg += fmt::format("No checkpoint was written after step {}; the last good checkpoint is {}.\n", good,
                       s.last_checkpoint);
  else if (good > 0)
    msg += fmt::format("No checkpoint was written after step {}; there is no earlier checkpoint to resume from.\n",
                       good);
  else
    msg += "No checkpoint was written; there is no checkpoint to resume from.\n";
  std::vector<std::string> tries;
  if (s.in_weights) {
    tries.push_back(fmt::format("check the weights named above: they are non-finite before the step's update (a "
                                "skipped update never writes them), so check the model or checkpoint they were loaded "
                                "from ({})",
                                s.weights_source));
  } else {
    tries.push_back(fmt::format("lower learning_rate (now {:g}) or add warmup_steps", s.learning_rate));
    tries.push_back(fmt::format("check the data of {}", steps));
  }
  if (s.gpu) tries.push_back("LT_ATTN=own runs the GPU attention on lazytrain's own kernels instead of cuDNN's");
  if (!s.in_weights)
    tries.push_back(fmt::format("a larger max_skipped_steps (now {}) lets training ride out short runs of non-finite "
                                "steps (the step that makes max_skipped_steps in a row stops it)",
                                s.max_skipped_steps));
  msg += fmt::format("What to try: {}.", fmt::join(tries, "; "));
  if (!s.last_checkpoint.empty() && !bad_source)
    msg += fmt::format("\nResume from the last good checkpoint with: {}", s.resume_command);
  return msg;
}

std::string nonfinite_peer_stop_message(const NonFiniteStop& s) {
  const int64_t n = s.step - s.first_step + 1;
  return fmt::format("training stopped at step {} with every rank: {} in a row ({}) had {}, {}; rank 0's output says "
                     "where it first appeared",
                     s.step, plural(n, "step", "steps"), steps_range(s.first_step, s.step), streak_what(s),
                     limit_reached(s.max_skipped_steps));
}

}  // namespace lt::train
