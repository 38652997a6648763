#include "backend/backend.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/units.h"

namespace lt {

const char* mem_kind_name(MemKind k) { return k == MemKind::Device ? "device" : "pinned"; }

const char* lane_name(Lane l) {
  switch (l) {
    case Lane::Compute: return "compute";
    case Lane::H2D: return "h2d";
    case Lane::D2H: return "d2h";
  }
  return "?";
}

void MemoryTracker::set_budget(MemKind k, int64_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  budget_[int(k)] = bytes < 0 ? kUnlimited : bytes;
}

int64_t MemoryTracker::budget(MemKind k) const {
  std::lock_guard<std::mutex> g(mu_);
  return budget_[int(k)];
}

void MemoryTracker::reserve(MemKind k, int64_t bytes, const std::string& tag) {
  LT_CHECK(bytes >= 0, "memory: negative allocation of {} bytes for '{}'", bytes, tag);
  std::lock_guard<std::mutex> g(mu_);
  const int i = int(k);
  if (budget_[i] >= 0 && cur_[i] + bytes > budget_[i]) {
    const int64_t short_by = cur_[i] + bytes - budget_[i];
    fail("does not fit: {} short by {} ({} asks {}, in use {} of {})", mem_kind_name(k), format_bytes(double(short_by)),
         tag, format_bytes(double(bytes)), format_bytes(double(cur_[i])), format_bytes(double(budget_[i])));
  }
  cur_[i] += bytes;
  peak_[i] = std::max(peak_[i], cur_[i]);
  auto& t = tags_[{i, tag}];
  t.kind = k;
  t.tag = tag;
  t.current += bytes;
  t.peak = std::max(t.peak, t.current);
  t.count += 1;
}

void MemoryTracker::release(MemKind k, int64_t bytes, const std::string& tag) {
  std::lock_guard<std::mutex> g(mu_);
  const int i = int(k);
  cur_[i] -= bytes;
  auto it = tags_.find({i, tag});
  if (it != tags_.end()) {
    it->second.current -= bytes;
    it->second.count -= 1;
  }
}

int64_t MemoryTracker::current(MemKind k) const {
  std::lock_guard<std::mutex> g(mu_);
  return cur_[int(k)];
}

int64_t MemoryTracker::peak(MemKind k) const {
  std::lock_guard<std::mutex> g(mu_);
  return peak_[int(k)];
}

void MemoryTracker::reset_peaks() {
  std::lock_guard<std::mutex> g(mu_);
  for (int i = 0; i < 2; ++i) peak_[i] = cur_[i];
  for (auto& [k, t] : tags_) t.peak = t.current;
}

std::vector<MemoryTracker::TagStat> MemoryTracker::tags() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<TagStat> out;
  for (auto& [k, t] : tags_) out.push_back(t);
  return out;
}

std::string MemoryTracker::table() const {
  auto ts = tags();
  std::string s = fmt::format("{:<8} {:<24} {:>6} {:>12} {:>12}\n", "kind", "tag", "live", "current", "peak");
  for (const auto& t : ts)
    s += fmt::format("{:<8} {:<24} {:>6} {:>12} {:>12}\n", mem_kind_name(t.kind), t.tag, t.count,
                     format_bytes(double(t.current)), format_bytes(double(t.peak)));
  for (MemKind k : {MemKind::Device, MemKind::Pinned}) {
    const int64_t b = budget(k);
    s += fmt::format("{:<8} {:<24} {:>6} {:>12} {:>12}   budget {}\n", mem_kind_name(k), "TOTAL", "",
                     format_bytes(double(current(k))), format_bytes(double(peak(k))),
                     b < 0 ? std::string("unlimited") : format_bytes(double(b)));
  }
  return s;
}

Backend::Backend(const ModelConfig& c) : cfg_(c), layout_(model_layout(c)) {}

void Backend::hold_workspace(int64_t bytes) {
  (void)bytes;
  fail("backend {}: cannot hold a workspace for a run (hold_workspace)", name());
}

void fail_workspace_held(const char* op, const OpLabel& l, int64_t rows, int64_t asks, int64_t held) {
  fail("internal: {} ('{}', window {}, index {}) on {} rows asks {} of workspace, but the run holds it at {} "
       "(hold_workspace was not sized for this call)",
       op, l.what, l.window, l.index, rows, format_bytes(double(asks)), format_bytes(double(held)));
}

void Backend::head_loss_lse(const void*, const void*, const int32_t*, const DevGeometry&, const void*, float, void*, void*,
                            float*, double*, OpLabel) {
  fail("backend {}: no LM head gradient by vocabulary slices (head_grad_slices needs has_sliced_head_grad)", name());
}

void Backend::head_lm_grad_slice(const void*, const void*, const int32_t*, const DevGeometry&, const void*, const float*,
                                 float, int64_t, int64_t, void*, OpLabel) {
  fail("backend {}: no LM head gradient by vocabulary slices (head_grad_slices needs has_sliced_head_grad)", name());
}

void Backend::embed_backward_acc(const int32_t*, int64_t, const void*, void*, DType, double*, OpLabel) {
  fail("backend {}: no embedding gradient accumulated into a held gradient", name());
}

void Backend::adamw_step(const AdamWStepScalars&, float*, bf16_t*, uint16_t*, const float*, float*, float*, int64_t,
                         OpLabel) {
  fail("backend {}: no optimizer update on the device (use embedding_update: host)", name());
}

void Backend::adamw_step_q8(const AdamWStepScalars&, const Q8Maps&, float*, bf16_t*, uint16_t*, const float*, uint8_t*,
                            uint8_t*, float*, float*, int64_t, OpLabel) {
  fail("backend {}: no 8-bit optimizer update on the device", name());
}

}  // namespace lt
