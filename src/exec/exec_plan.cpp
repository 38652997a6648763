#include "exec/exec_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace lt {

const char* ckpt_tier_name(CkptTier t) {
  switch (t) {
    case CkptTier::None: return "none";
    case CkptTier::Gpu: return "gpu";
    case CkptTier::Cpu: return "cpu";
    case CkptTier::Nvme: return "nvme";
  }
  return "?";
}

const char* window_kind_name(WindowKind k) {
  switch (k) {
    case WindowKind::Forward: return "fwd";
    case WindowKind::Head: return "head";
    case WindowKind::Recompute: return "recompute";
    case WindowKind::Backward: return "bwd";
  }
  return "?";
}

ExecPlan ExecPlan::keep_all(int64_t layers, int64_t batch, int64_t seq) {
  ExecPlan p;
  p.batch = batch;
  p.seq = seq;
  p.tier.assign(size_t(layers + 1), CkptTier::Gpu);
  return p;
}

std::vector<int64_t> plan_checkpoints(const ExecPlan& p) {
  std::vector<int64_t> c;
  const int64_t L = int64_t(p.tier.size()) - 1;
  for (int64_t i = 0; i < L; ++i)
    if (p.tier[size_t(i)] != CkptTier::None) c.push_back(i);
  c.push_back(L);
  return c;
}

std::vector<WindowRef> plan_windows(const ExecPlan& p) {
  const int64_t L = int64_t(p.tier.size()) - 1;
  std::vector<WindowRef> w;
  for (int64_t j = 0; j < L; ++j) w.push_back({WindowKind::Forward, int32_t(j)});
  w.push_back({WindowKind::Head, -1});
  auto ck = plan_checkpoints(p);
  for (size_t b = ck.size() - 1; b >= 1; --b) {
    const int64_t s = ck[b - 1], e = ck[b];
    for (int64_t j = s; j <= e - 2; ++j) w.push_back({WindowKind::Recompute, int32_t(j)});
    for (int64_t j = e - 1; j >= s; --j) w.push_back({WindowKind::Backward, int32_t(j)});
  }
  return w;
}

int32_t block_first_window(const ExecPlan& p, int64_t s) {
  const int64_t L = int64_t(p.tier.size()) - 1;
  auto ck = plan_checkpoints(p);
  int64_t w = L + 1;
  for (size_t b = ck.size() - 1; b >= 1; --b) {
    if (ck[b - 1] == s) return int32_t(w);
    w += 2 * (ck[b] - ck[b - 1]) - 1;
  }
  fail("plan: boundary {} does not start a block", s);
}

ExecPlan::Traffic effective_traffic(const ExecPlan& p, int64_t i) {
  const int64_t L = int64_t(p.tier.size()) - 1;
  ExecPlan::Traffic t;
  if (!p.traffic.empty()) t = p.traffic[size_t(i)];
  const CkptTier tier = p.tier[size_t(i)];
  if (t.d2h.empty()) t.d2h = {{int32_t(i), 1.0}};
  const int32_t first = block_first_window(p, i);
  if (t.h2d.empty()) t.h2d = {{int32_t(std::max<int64_t>(L, first - 1)), 1.0}};
  if (tier == CkptTier::Nvme) {
    if (t.nvme_write.empty()) t.nvme_write = t.d2h;
    if (t.nvme_read.empty()) t.nvme_read = {{int32_t(std::max<int64_t>(L, t.h2d.front().window - 1)), 1.0}};
  } else {
    t.nvme_write.clear();
    t.nvme_read.clear();
  }
  return t;
}

namespace {
void check_shares(const std::vector<ExecPlan::Share>& v, const char* what, int64_t b, int64_t lo, int64_t hi) {
  LT_CHECK(!v.empty(), "plan: boundary {}: {} has no shares", b, what);
  double sum = 0;
  int32_t last = -1;
  for (auto& s : v) {
    LT_CHECK(s.window >= lo && s.window <= hi, "plan: boundary {}: {} share in window {}, expected [{}, {}]", b, what,
             s.window, lo, hi);
    LT_CHECK(s.window >= last, "plan: boundary {}: {} shares not in window order ({} after {})", b, what, s.window,
             last);
    LT_CHECK(s.fraction > 0 && s.fraction <= 1, "plan: boundary {}: {} fraction {} outside (0, 1]", b, what,
             s.fraction);
    last = s.window;
    sum += s.fraction;
  }
  LT_CHECK(std::abs(sum - 1.0) < 1e-6, "plan: boundary {}: {} fractions sum to {}, expected 1", b, what, sum);
}
}  // namespace

void validate_plan(const ExecPlan& p, int64_t layers) {
  LT_CHECK(p.batch > 0 && p.seq > 0, "plan: batch {} and seq {} must be positive", p.batch, p.seq);
  LT_CHECK(int64_t(p.tier.size()) == layers + 1, "plan: 'tier' has {} boundaries, expected layers+1 = {}",
           p.tier.size(), layers + 1);
  LT_CHECK(p.tier[0] != CkptTier::None, "plan: boundary 0 must be materialised (tier is 'none')");
  LT_CHECK(p.ring >= 2, "plan: 'ring' is {}, expected >= 2 weight buffers", p.ring);
  LT_CHECK(p.chunk_samples >= 0 && p.chunk_samples <= p.batch, "plan: 'chunk_samples' is {}, expected 0..{}",
           p.chunk_samples, p.batch);
  LT_CHECK(p.nvme_staging >= 1, "plan: 'nvme_staging' is {}, expected >= 1", p.nvme_staging);
  LT_CHECK(p.kept_layers >= 0 && p.kept_layers <= layers, "plan: 'kept_layers' is {}, expected 0..{}", p.kept_layers,
           layers);
  LT_CHECK(p.traffic.empty() || int64_t(p.traffic.size()) == layers + 1,
           "plan: 'traffic' has {} entries, expected {}", p.traffic.size(), layers + 1);
  const int64_t L = layers;
  for (int64_t i = 0; i < L; ++i) {
    const CkptTier t = p.tier[size_t(i)];
    if (t != CkptTier::Cpu && t != CkptTier::Nvme) continue;
    auto tr = effective_traffic(p, i);
    const int64_t first = block_first_window(p, i);
    check_shares(tr.d2h, "d2h", i, i, L);
    check_shares(tr.h2d, "h2d", i, L, first);
    if (t == CkptTier::Nvme) {
      check_shares(tr.nvme_write, "nvme_write", i, tr.d2h.front().window, L);
      check_shares(tr.nvme_read, "nvme_read", i, tr.nvme_write.front().window, tr.h2d.back().window);
    }
  }
  const size_t nw = plan_windows(p).size();
  LT_CHECK(p.predicted.empty() || p.predicted.size() == nw, "plan: 'predicted' has {} windows, expected {}",
           p.predicted.size(), nw);
}

std::string describe_plan(const ExecPlan& p) {
  std::string s = "ckpt";
  for (size_t i = 0; i + 1 < p.tier.size(); ++i)
    if (p.tier[i] != CkptTier::None) s += fmt::format(" {}:{}", i, ckpt_tier_name(p.tier[i]));
  s += fmt::format(" | ring {} chunk {} batch {} seq {}", p.ring, p.chunk_samples, p.batch, p.seq);
  if (p.kept_layers > 0) s += fmt::format(" | kept {}", p.kept_layers);
  return s;
}

}  // namespace lt
