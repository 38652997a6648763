#include "exec/plan_adapter.h"

#include "core/error.h"

namespace lt {

namespace {
std::vector<ExecPlan::Share> shares(const std::vector<Share>& v) {
  std::vector<ExecPlan::Share> o;
  for (auto& s : v) o.push_back({s.window, s.fraction});
  return o;
}
CkptTier tier(Tier t) {
  switch (t) {
    case Tier::None: return CkptTier::None;
    case Tier::Gpu: return CkptTier::Gpu;
    case Tier::Cpu: return CkptTier::Cpu;
    case Tier::Nvme: return CkptTier::Nvme;
  }
  fail("plan: unknown tier {}", int(t));
}
}  // namespace

ExecPlan exec_plan_from(const Plan& p, const ModelConfig& c) {
  validate_plan(p);
  check_plan_matches(p, c.layers, c.hidden, c.vocab, p.batch, p.seq);
  ExecPlan e;
  e.batch = p.batch;
  e.seq = p.seq;
  for (Tier t : p.tier) e.tier.push_back(tier(t));
  e.ring = p.ring;
  e.chunk_samples = p.chunk >= p.batch ? 0 : p.chunk;
  e.nvme_staging = p.nvme_staging;
  e.embedding_resident = p.embedding_resident;
  e.head_resident = p.head_resident;
  e.kept_layers = p.kept_layers;
  e.traffic.resize(size_t(p.layers + 1));
  for (auto& t : p.traffic) {
    LT_CHECK(t.boundary >= 0 && t.boundary < p.layers, "plan: traffic for boundary {} outside [0, {})", t.boundary,
             p.layers);
    auto& x = e.traffic[size_t(t.boundary)];
    x.d2h = shares(t.d2h);
    x.nvme_write = shares(t.nvme_write);
    x.nvme_read = shares(t.nvme_read);
    x.h2d = shares(t.h2d);
  }
  for (auto& w : p.predicted.windows)
    e.predicted.push_back({w.compute, w.h2d, w.d2h, w.nvme_read, w.nvme_write, w.exposed});
  e.predicted_step_s = p.predicted.step_s;
  validate_plan(e, c.layers);
  return e;
}

}  // namespace lt
