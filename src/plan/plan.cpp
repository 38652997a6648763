// Plan windows, validation and JSON (see plan.h for the semantics).
#include "plan/plan.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace lt {

using nlohmann::json;

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::None: return "none";
    case Tier::Gpu: return "gpu";
    case Tier::Cpu: return "cpu";
    case Tier::Nvme: return "nvme";
  }
  return "?";
}

Tier parse_tier(const std::string& s) {
  if (s == "none") return Tier::None;
  if (s == "gpu") return Tier::Gpu;
  if (s == "cpu") return Tier::Cpu;
  if (s == "nvme") return Tier::Nvme;
  fail("invalid tier '{}': expected none, gpu, cpu or nvme", s);
}

std::vector<Block> blocks_from_tiers(const std::vector<Tier>& tier) {
  std::vector<Block> b;
  int32_t prev = -1;
  for (int32_t i = 0; i < int32_t(tier.size()); ++i) {
    if (tier[size_t(i)] == Tier::None) continue;
    if (prev >= 0) b.push_back({prev, i});
    prev = i;
  }
  return b;
}

std::vector<int32_t> plan_checkpoints(const Plan& p) {
  std::vector<int32_t> r;
  for (int32_t i = 0; i < int32_t(p.tier.size()); ++i)
    if (p.tier[size_t(i)] != Tier::None) r.push_back(i);
  return r;
}

std::vector<PlanWindow> plan_windows(const Plan& p) {
  std::vector<PlanWindow> w;
  const int32_t L = int32_t(p.layers);
  for (int32_t j = 0; j < L; ++j) w.push_back({PlanWindowKind::Forward, j});
  w.push_back({PlanWindowKind::Head, -1});
  auto blocks = blocks_from_tiers(p.tier);
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    for (int32_t j = it->start; j <= it->end - 2; ++j) w.push_back({PlanWindowKind::Recompute, j});
    for (int32_t j = it->end - 1; j >= it->start; --j) w.push_back({PlanWindowKind::Backward, j});
  }
  return w;
}

int32_t block_first_window(const Plan& p, int32_t s) {
  auto blocks = blocks_from_tiers(p.tier);
  int32_t w = int32_t(p.layers) + 1;
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    if (it->start == s) return w;
    w += 2 * (it->end - it->start) - 1;
  }
  fail("plan: boundary {} does not start a block", s);
}

namespace {

void check_shares(const std::vector<Share>& v, const char* kind, int32_t b, int32_t lo, int32_t hi, bool required) {
  if (!required) {
    LT_CHECK(v.empty(), "plan: traffic[boundary {}].{} must be empty for this tier, got {} shares", b, kind, v.size());
    return;
  }
  LT_CHECK(!v.empty(), "plan: traffic[boundary {}].{} is missing (needs at least one share)", b, kind);
  double sum = 0;
  int32_t last = -1;
  for (auto& s : v) {
    LT_CHECK(s.window >= lo && s.window <= hi, "plan: traffic[boundary {}].{} window {} out of range: expected [{}, {}]",
             b, kind, s.window, lo, hi);
    LT_CHECK(s.window > last, "plan: traffic[boundary {}].{} windows must be strictly ascending (got {} after {})", b, kind,
             s.window, last);
    LT_CHECK(std::isfinite(s.fraction) && s.fraction > 0 && s.fraction <= 1 + 1e-9,
             "plan: traffic[boundary {}].{} fraction {} out of range (0, 1]", b, kind, s.fraction);
    last = s.window;
    sum += s.fraction;
  }
  LT_CHECK(std::fabs(sum - 1) < 1e-6, "plan: traffic[boundary {}].{} fractions sum to {}, expected 1", b, kind, sum);
}

// Cumulative fraction of `v` issued in windows < w (completed by the start of w).
double cum_before(const std::vector<Share>& v, int32_t w) {
  double s = 0;
  for (auto& x : v)
    if (x.window < w) s += x.fraction;
  return s;
}
double cum_upto(const std::vector<Share>& v, int32_t w) { return cum_before(v, w + 1); }

// Range [a] of `later` may only be issued once `earlier` completed it (in a previous window).
void check_order(const std::vector<Share>& earlier, const std::vector<Share>& later, int32_t b, const char* ne,
                 const char* nl) {
  for (auto& x : later) {
    double need = cum_upto(later, x.window), have = cum_before(earlier, x.window);
    LT_CHECK(need <= have + 1e-6,
             "plan: traffic[boundary {}].{} issues {:.3f} of the boundary by window {} but {} completed only {:.3f} before it",
             b, nl, need, x.window, ne, have);
  }
}

}  // namespace

void validate_plan(const Plan& p) {
  LT_CHECK(p.version == kPlanVersion, "plan: version {} is not supported (expected {})", p.version, kPlanVersion);
  LT_CHECK(p.layers >= 1, "plan: layers must be >= 1, got {}", p.layers);
  LT_CHECK(p.hidden >= 1 && p.vocab >= 1, "plan: hidden and vocab must be >= 1, got {} and {}", p.hidden, p.vocab);
  LT_CHECK(p.batch >= 1 && p.seq >= 1, "plan: batch and seq must be >= 1, got {} and {}", p.batch, p.seq);
  LT_CHECK(p.micro_batches >= 1, "plan: micro_batches must be >= 1, got {}", p.micro_batches);
  LT_CHECK(p.chunk >= 1 && p.chunk <= p.batch, "plan: chunk must be in [1, batch={}], got {}", p.batch, p.chunk);
  LT_CHECK(p.ring >= 2, "plan: ring must be >= 2 weight buffers, got {}", p.ring);
  LT_CHECK(p.nvme_staging >= 1, "plan: nvme_staging must be >= 1, got {}", p.nvme_staging);
  LT_CHECK(p.kept_layers >= 0 && p.kept_layers <= p.layers, "plan: kept_layers must be in [0, layers={}], got {}",
           p.layers, p.kept_layers);
  const int32_t L = int32_t(p.layers);
  LT_CHECK(int64_t(p.tier.size()) == p.layers + 1, "plan: tier has {} entries, expected layers+1 = {}", p.tier.size(),
           p.layers + 1);
  LT_CHECK(p.tier[0] == Tier::Gpu, "plan: tier[0] must be gpu (input boundary stays on the device), got {}",
           tier_name(p.tier[0]));
  LT_CHECK(p.tier[size_t(L)] == Tier::Gpu, "plan: tier[{}] must be gpu (output boundary stays on the device), got {}", L,
           tier_name(p.tier[size_t(L)]));
  auto derived = blocks_from_tiers(p.tier);
  LT_CHECK(derived.size() == p.blocks.size(), "plan: blocks has {} entries but the materialised boundaries give {}",
           p.blocks.size(), derived.size());
  for (size_t k = 0; k < derived.size(); ++k)
    LT_CHECK(derived[k].start == p.blocks[k].start && derived[k].end == p.blocks[k].end,
             "plan: blocks[{}] is ({},{}) but the materialised boundaries give ({},{})", k, p.blocks[k].start,
             p.blocks[k].end, derived[k].start, derived[k].end);

  const int32_t nw = int32_t(plan_windows(p).size());
  std::set<int32_t> seen;
  int32_t prev = -1;
  for (auto& t : p.traffic) {
    const int32_t b = t.boundary;
    LT_CHECK(b >= 1 && b < L, "plan: traffic boundary {} out of range [1, {}]", b, L - 1);
    LT_CHECK(b > prev, "plan: traffic entries must be in ascending boundary order (got {} after {})", b, prev);
    prev = b;
    const Tier tr = p.tier[size_t(b)];
    LT_CHECK(tr == Tier::Cpu || tr == Tier::Nvme, "plan: traffic given for boundary {} whose tier is {} (expected cpu or nvme)",
             b, tier_name(tr));
    seen.insert(b);
    const int32_t first = block_first_window(p, b);
    const bool nv = tr == Tier::Nvme;
    check_shares(t.d2h, "d2h", b, b, L, true);
    check_shares(t.h2d, "h2d", b, L, first - 1, true);
    check_shares(t.nvme_write, "nvme_write", b, t.d2h.front().window + 1, L, nv);
    if (nv) check_shares(t.nvme_read, "nvme_read", b, t.nvme_write.front().window + 1, t.h2d.back().window, nv);
    else check_shares(t.nvme_read, "nvme_read", b, 0, 0, false);
    if (nv) {
      check_order(t.d2h, t.nvme_write, b, "d2h", "nvme_write");
      check_order(t.nvme_write, t.nvme_read, b, "nvme_write", "nvme_read");
      check_order(t.nvme_read, t.h2d, b, "nvme_read", "h2d");
    } else {
      check_order(t.d2h, t.h2d, b, "d2h", "h2d");
    }
    (void)nw;
  }
  for (int32_t i = 1; i < L; ++i) {
    const Tier tr = p.tier[size_t(i)];
    if (tr == Tier::Cpu || tr == Tier::Nvme)
      LT_CHECK(seen.count(i), "plan: boundary {} has tier {} but no traffic entry", i, tier_name(tr));
  }
  std::set<std::string> names;
  for (auto& n : p.optimizer_8bit) {
    LT_CHECK(!n.empty(), "plan: optimizer_8bit has an empty tensor name");
    LT_CHECK(names.insert(n).second, "plan: optimizer_8bit lists '{}' twice", n);
    LT_CHECK(n.find("norm") == std::string::npos, "plan: optimizer_8bit lists '{}': norms keep fp32 states", n);
    LT_CHECK(p.placement.embedding_8bit || n.find("embed_tokens") == std::string::npos,
             "plan: optimizer_8bit lists '{}', but embedding_8bit is not set", n);
  }
}

void check_plan_matches(const Plan& p, int64_t layers, int64_t hidden, int64_t vocab, int64_t batch, int64_t seq) {
  LT_CHECK(p.layers == layers, "plan was made for {} layers, the model has {}", p.layers, layers);
  LT_CHECK(p.hidden == hidden, "plan was made for hidden size {}, the model has {}", p.hidden, hidden);
  LT_CHECK(p.vocab == vocab, "plan was made for vocab {}, the model has {}", p.vocab, vocab);
  LT_CHECK(p.batch == batch, "plan was made for batch {}, the run uses {}", p.batch, batch);
  LT_CHECK(p.seq == seq, "plan was made for seq {}, the run uses {}", p.seq, seq);
}

// ---------------------------------------------------------------- JSON

namespace {

json shares_json(const std::vector<Share>& v) {
  json a = json::array();
  for (auto& s : v) a.push_back(json::array({s.window, s.fraction}));
  return a;
}

json window_pred_json(const WindowPrediction& w) {
  return {{"compute", w.compute}, {"h2d", w.h2d}, {"d2h", w.d2h}, {"nvme_read", w.nvme_read},
          {"nvme_write", w.nvme_write}, {"exposed", w.exposed}};
}

// Strict object reader: every key must be known, required keys present, types checked.
class Obj {
 public:
  Obj(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    LT_CHECK(j.is_object(), "{}: expected a JSON object, got {}", where_, j.type_name());
  }
  const json& req(const std::string& k) {
    used_.insert(k);
    LT_CHECK(j_.contains(k), "{}: missing field '{}'", where_, k);
    return j_.at(k);
  }
  const json* opt(const std::string& k) {
    used_.insert(k);
    return j_.contains(k) ? &j_.at(k) : nullptr;
  }
  template <typename T>
  T get(const std::string& k) {
    const json& v = req(k);
    return as<T>(v, k);
  }
  template <typename T>
  T get_or(const std::string& k, T def) {
    const json* v = opt(k);
    return v ? as<T>(*v, k) : def;
  }
  template <typename T>
  T as(const json& v, const std::string& k) {
    if constexpr (std::is_same_v<T, bool>) {
      LT_CHECK(v.is_boolean(), "{}: field '{}' must be a boolean, got {}", where_, k, v.dump());
    } else if constexpr (std::is_integral_v<T>) {
      LT_CHECK(v.is_number_integer(), "{}: field '{}' must be an integer, got {}", where_, k, v.dump());
    } else if constexpr (std::is_floating_point_v<T>) {
      LT_CHECK(v.is_number(), "{}: field '{}' must be a number, got {}", where_, k, v.dump());
    } else {
      LT_CHECK(v.is_string(), "{}: field '{}' must be a string, got {}", where_, k, v.dump());
    }
    return v.get<T>();
  }
  void done() {
    for (auto& [k, v] : j_.items()) LT_CHECK(used_.count(k), "{}: unknown field '{}'", where_, k);
  }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  std::string where_;
  std::set<std::string> used_;
};

std::vector<Share> shares_from(const json& j, const std::string& where) {
  LT_CHECK(j.is_array(), "{}: expected an array of [window, fraction], got {}", where, j.type_name());
  std::vector<Share> v;
  for (auto& e : j) {
    LT_CHECK(e.is_array() && e.size() == 2 && e[0].is_number_integer() && e[1].is_number(),
             "{}: each share must be [window (integer), fraction (number)], got {}", where, e.dump());
    v.push_back({e[0].get<int32_t>(), e[1].get<double>()});
  }
  return v;
}

}  // namespace

json plan_to_json(const Plan& p) {
  json j;
  j["version"] = p.version;
  j["model"] = p.model;
  j["layers"] = p.layers;
  j["hidden"] = p.hidden;
  j["vocab"] = p.vocab;
  j["batch"] = p.batch;
  j["seq"] = p.seq;
  j["micro_batches"] = p.micro_batches;
  j["chunk"] = p.chunk;
  j["ring"] = p.ring;
  j["nvme_staging"] = p.nvme_staging;
  json t = json::array();
  for (auto x : p.tier) t.push_back(tier_name(x));
  j["tier"] = t;
  json b = json::array();
  for (auto& x : p.blocks) b.push_back(json::array({x.start, x.end}));
  j["blocks"] = b;
  json tr = json::array();
  for (auto& c : p.traffic) {
    json e{{"boundary", c.boundary}, {"d2h", shares_json(c.d2h)}, {"h2d", shares_json(c.h2d)}};
    if (!c.nvme_write.empty() || !c.nvme_read.empty()) {
      e["nvme_write"] = shares_json(c.nvme_write);
      e["nvme_read"] = shares_json(c.nvme_read);
    }
    tr.push_back(e);
  }
  j["traffic"] = tr;
  j["embedding_resident"] = p.embedding_resident;
  j["head_resident"] = p.head_resident;
  j["kept_layers"] = p.kept_layers;
  j["optimizer_8bit"] = p.optimizer_8bit;
  j["master_weights"] = master_mode_name(p.placement.master);
  j["gradients"] = grad_home_name(p.placement.grads);
  j["gradient_dtype"] = grad_dtype_name(p.placement.grad_dtype);
  if (p.placement.embedding_8bit) j["embedding_8bit"] = true;
  if (p.placement.nvme_layers > 0) j["nvme_moment_layers"] = p.placement.nvme_layers;
  if (p.placement.nvme_remainders) j["nvme_remainders"] = true;
  if (p.placement.grad_ring_depth != kGradRingDepth) j["gradient_ring_depth"] = p.placement.grad_ring_depth;
  if (p.placement.head_grad_slices) j["head_grad_slices"] = true;
  if (p.placement.moment_shards > 1) j["moment_shards"] = p.placement.moment_shards;
  if (p.placement.fp32_master_array) j["fp32_master_array"] = true;
  if (p.placement.embedding_update_device) j["embedding_update"] = "device";
  if (p.placement.device_update_layers > 0) j["device_update_layers"] = p.placement.device_update_layers;
  j["planner"] = p.planner;
  j["hbm_cap"] = p.hbm_cap;
  j["dram_cap"] = p.dram_cap;
  j["nvme_cap"] = p.nvme_cap;
  const auto& q = p.predicted;
  json pr{{"step_s", q.step_s},           {"compute_s", q.compute_s},       {"recompute_s", q.recompute_s},
          {"exposed_h2d_s", q.exposed_h2d_s}, {"exposed_d2h_s", q.exposed_d2h_s}, {"exposed_nvme_s", q.exposed_nvme_s},
          {"exposed_optimizer_s", q.exposed_optimizer_s}, {"tflops", q.tflops}, {"peak_hbm", q.peak_hbm},
          {"peak_dram", q.peak_dram},     {"nvme_bytes", q.nvme_bytes}};
  json w = json::array();
  for (auto& x : q.windows) w.push_back(window_pred_json(x));
  pr["windows"] = w;
  j["predicted"] = pr;
  return j;
}

namespace {

std::vector<Tier> tiers_from(const json& t, const std::string& source) {
  LT_CHECK(t.is_array(), "{}: field 'tier' must be an array of tier names", source);
  std::vector<Tier> v;
  for (size_t i = 0; i < t.size(); ++i) {
    LT_CHECK(t[i].is_string(), "{}: tier[{}] must be a string, got {}", source, i, t[i].dump());
    try {
      v.push_back(parse_tier(t[i].get<std::string>()));
    } catch (const Error& e) {
      fail("{}: tier[{}]: {}", source, i, e.what());
    }
  }
  return v;
}

std::vector<Block> blocks_from(const json& b, const std::string& source) {
  LT_CHECK(b.is_array(), "{}: field 'blocks' must be an array of [start, end]", source);
  std::vector<Block> v;
  for (size_t i = 0; i < b.size(); ++i) {
    LT_CHECK(b[i].is_array() && b[i].size() == 2 && b[i][0].is_number_integer() && b[i][1].is_number_integer(),
             "{}: blocks[{}] must be [start, end] integers, got {}", source, i, b[i].dump());
    v.push_back({b[i][0].get<int32_t>(), b[i][1].get<int32_t>()});
  }
  return v;
}

std::vector<CheckpointTraffic> traffic_from(const json& t, const std::string& source) {
  LT_CHECK(t.is_array(), "{}: field 'traffic' must be an array", source);
  std::vector<CheckpointTraffic> v;
  for (size_t i = 0; i < t.size(); ++i) {
    Obj e(t[i], fmt::format("{}: traffic[{}]", source, i));
    CheckpointTraffic c;
    c.boundary = e.get<int32_t>("boundary");
    c.d2h = shares_from(e.req("d2h"), e.where() + ".d2h");
    c.h2d = shares_from(e.req("h2d"), e.where() + ".h2d");
    if (auto* w = e.opt("nvme_write")) c.nvme_write = shares_from(*w, e.where() + ".nvme_write");
    if (auto* r = e.opt("nvme_read")) c.nvme_read = shares_from(*r, e.where() + ".nvme_read");
    e.done();
    v.push_back(std::move(c));
  }
  return v;
}

std::vector<std::string> names_from(const json& v, const std::string& source) {
  LT_CHECK(v.is_array(), "{}: field 'optimizer_8bit' must be an array of tensor names", source);
  std::vector<std::string> names;
  for (auto& n : v) {
    LT_CHECK(n.is_string(), "{}: optimizer_8bit entries must be strings, got {}", source, n.dump());
    names.push_back(n.get<std::string>());
  }
  return names;
}

// The model-state fields (absent in older plans: fp32 masters, host gradients, everything in DRAM).
StatePlacement placement_from(Obj& o, const std::string& source) {
  StatePlacement s;
  try {
    s.master = parse_master_mode(o.get_or<std::string>("master_weights", "fp32"));
    s.grads = parse_grad_home(o.get_or<std::string>("gradients", "host"));
    s.grad_dtype = parse_grad_dtype(o.get_or<std::string>("gradient_dtype", "fp32"));
    s.embedding_8bit = o.get_or<bool>("embedding_8bit", false);
    s.nvme_layers = o.get_or<int64_t>("nvme_moment_layers", 0);
    s.nvme_remainders = o.get_or<bool>("nvme_remainders", false);
    s.grad_ring_depth = int(o.get_or<int64_t>("gradient_ring_depth", kGradRingDepth));
    LT_CHECK(s.grad_ring_depth >= 1, "field 'gradient_ring_depth' must be >= 1, got {}", s.grad_ring_depth);
    s.head_grad_slices = o.get_or<bool>("head_grad_slices", false);
    s.moment_shards = int(o.get_or<int64_t>("moment_shards", 1));
    LT_CHECK(s.moment_shards >= 1, "field 'moment_shards' must be >= 1, got {}", s.moment_shards);
    s.fp32_master_array = o.get_or<bool>("fp32_master_array", false);
    const std::string eu = o.get_or<std::string>("embedding_update", "host");
    LT_CHECK(eu == "host" || eu == "device", "field 'embedding_update': expected host or device, got '{}'", eu);
    s.embedding_update_device = eu == "device";
    s.device_update_layers = o.get_or<int64_t>("device_update_layers", 0);
    LT_CHECK(s.device_update_layers >= 0, "field 'device_update_layers' must be >= 0, got {}", s.device_update_layers);
  } catch (const Error& e) {
    fail("{}: {}", source, e.what());
  }
  return s;
}

PlanPrediction prediction_from(const json& pr, const std::string& source) {
  Obj q(pr, source + ": predicted");
  PlanPrediction d;
  d.step_s = q.get_or<double>("step_s", 0);
  d.compute_s = q.get_or<double>("compute_s", 0);
  d.recompute_s = q.get_or<double>("recompute_s", 0);
  d.exposed_h2d_s = q.get_or<double>("exposed_h2d_s", 0);
  d.exposed_d2h_s = q.get_or<double>("exposed_d2h_s", 0);
  d.exposed_nvme_s = q.get_or<double>("exposed_nvme_s", 0);
  d.exposed_optimizer_s = q.get_or<double>("exposed_optimizer_s", 0);
  d.tflops = q.get_or<double>("tflops", 0);
  d.peak_hbm = q.get_or<int64_t>("peak_hbm", 0);
  d.peak_dram = q.get_or<int64_t>("peak_dram", 0);
  d.nvme_bytes = q.get_or<int64_t>("nvme_bytes", 0);
  if (const json* w = q.opt("windows")) {
    LT_CHECK(w->is_array(), "{}: predicted.windows must be an array", source);
    for (size_t i = 0; i < w->size(); ++i) {
      Obj x((*w)[i], fmt::format("{}: predicted.windows[{}]", source, i));
      WindowPrediction wp;
      wp.compute = x.get<double>("compute");
      wp.h2d = x.get<double>("h2d");
      wp.d2h = x.get<double>("d2h");
      wp.nvme_read = x.get<double>("nvme_read");
      wp.nvme_write = x.get<double>("nvme_write");
      wp.exposed = x.get<double>("exposed");
      x.done();
      d.windows.push_back(wp);
    }
  }
  q.done();
  return d;
}

}  // namespace

Plan plan_from_json(const json& j, const std::string& source) {
  Obj o(j, source);
  Plan p;
  p.version = o.get<int>("version");
  LT_CHECK(p.version == kPlanVersion, "{}: plan version {} is not supported (expected {})", source, p.version, kPlanVersion);
  p.model = o.get<std::string>("model");
  p.layers = o.get<int64_t>("layers");
  p.hidden = o.get<int64_t>("hidden");
  p.vocab = o.get<int64_t>("vocab");
  p.batch = o.get<int64_t>("batch");
  p.seq = o.get<int64_t>("seq");
  p.micro_batches = o.get_or<int64_t>("micro_batches", 1);
  p.chunk = o.get<int64_t>("chunk");
  p.ring = o.get<int32_t>("ring");
  p.nvme_staging = o.get_or<int32_t>("nvme_staging", 2);
  p.tier = tiers_from(o.req("tier"), source);
  p.blocks = blocks_from(o.req("blocks"), source);
  p.traffic = traffic_from(o.req("traffic"), source);
  p.embedding_resident = o.get<bool>("embedding_resident");
  p.head_resident = o.get<bool>("head_resident");
  const int64_t kept = o.get_or<int64_t>("kept_layers", 0);  // absent in older plans: nothing kept
  LT_CHECK(kept >= 0 && kept <= p.layers, "{}: plan: kept_layers must be in [0, layers={}], got {}", source, p.layers, kept);
  p.kept_layers = int32_t(kept);
  p.optimizer_8bit = names_from(o.req("optimizer_8bit"), source);
  p.placement = placement_from(o, source);
  p.planner = o.get_or<std::string>("planner", "");
  p.hbm_cap = o.get_or<int64_t>("hbm_cap", 0);
  p.dram_cap = o.get_or<int64_t>("dram_cap", 0);
  p.nvme_cap = o.get_or<int64_t>("nvme_cap", 0);
  if (const json* pr = o.opt("predicted")) p.predicted = prediction_from(*pr, source);
  o.done();
  try {
    validate_plan(p);
  } catch (const Error& e) {
    fail("{}: {}", source, e.what());
  }
  if (!p.predicted.windows.empty())
    LT_CHECK(p.predicted.windows.size() == plan_windows(p).size(),
             "{}: predicted.windows has {} entries, the plan has {} windows", source, p.predicted.windows.size(),
             plan_windows(p).size());
  return p;
}

void save_plan(const Plan& p, const std::filesystem::path& path) {
  validate_plan(p);
  std::ofstream f(path);
  LT_CHECK(f.good(), "cannot write plan file {}", path.string());
  f << plan_to_json(p).dump(1) << "\n";
  LT_CHECK(f.good(), "error writing plan file {}", path.string());
}

Plan load_plan(const std::filesystem::path& path) {
  std::ifstream f(path);
  LT_CHECK(f.good(), "cannot open plan file {}", path.string());
  json j;
  try {
    j = json::parse(f);
  } catch (const json::parse_error& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
  return plan_from_json(j, path.string());
}

std::string describe_tiers(const Plan& p) {
  std::string s;
  for (auto i : plan_checkpoints(p)) {
    if (!s.empty()) s += ' ';
    s += fmt::format("{}:{}", i, tier_name(p.tier[size_t(i)]));
  }
  return s;
}

}  // namespace lt
