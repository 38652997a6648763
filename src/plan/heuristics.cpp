#include "plan/heuristics.h"

#include <cmath>

#include "core/error.h"
#include "plan/simulator.h"

namespace lt {

std::vector<int32_t> slot_first_window(const Instance& in, const Plan& p) {
  auto ws = window_slots(in, p);
  std::vector<int32_t> f(size_t(in.slots()), -1);
  for (size_t k = 0; k < ws.size(); ++k)
    if (f[size_t(ws[k])] < 0) f[size_t(ws[k])] = int32_t(k);
  return f;
}

bool tied_nvme_ok(int L, int i, int e) {
  // write slot i+1 must come strictly before the read slot 2L-e-1
  return i >= 1 && i + 1 < 2 * L - e - 1;
}

void assign_tied_traffic(const Instance& in, Plan& p) {
  const int L = in.L;
  p.blocks = blocks_from_tiers(p.tier);
  p.traffic.clear();
  auto first = slot_first_window(in, p);
  auto next_on_path = [&](int i) {
    for (int e = i + 1; e <= L; ++e)
      if (p.tier[size_t(e)] != Tier::None) return e;
    fail("plan: boundary {} has no materialised successor", i);
  };
  for (int i = 1; i < L; ++i) {
    Tier t = p.tier[size_t(i)];
    if (t != Tier::Cpu && t != Tier::Nvme) continue;
    const int e = next_on_path(i);
    CheckpointTraffic c;
    c.boundary = i;
    c.d2h = {{first[size_t(in.slot_F(i))], 1.0}};
    c.h2d = {{first[size_t(2 * L - e)], 1.0}};
    if (t == Tier::Nvme) {
      LT_CHECK(tied_nvme_ok(L, i, e), "plan: boundary {} cannot be on nvme with the next checkpoint at {} (no window to write "
               "it before it is read back)", i, e);
      c.nvme_write = {{first[size_t(i + 1)], 1.0}};
      c.nvme_read = {{first[size_t(2 * L - e - 1)], 1.0}};
    }
    p.traffic.push_back(std::move(c));
  }
}

std::vector<Tier> heuristic_tiers(const std::string& name, int L) {
  std::vector<Tier> t(size_t(L + 1), Tier::None);
  t[0] = t[size_t(L)] = Tier::Gpu;
  auto every = [&](int k, Tier tier) {
    for (int i = k; i < L; i += k) t[size_t(i)] = tier;
  };
  if (name.rfind("megatrain", 0) == 0) {
    int k = 4;
    if (name.size() > 9) {
      LT_CHECK(name[9] == ':', "unknown planner '{}': expected megatrain:K", name);
      try {
        k = std::stoi(name.substr(10));
      } catch (...) {
        fail("unknown planner '{}': K must be an integer", name);
      }
    }
    LT_CHECK(k >= 1, "planner {}: K must be >= 1", name);
    every(k, Tier::Gpu);
  } else if (name == "all-gpu") {
    every(1, Tier::Gpu);
  } else if (name == "sqrt") {
    every(std::max(1, int(std::ceil(std::sqrt(double(L))))), Tier::Gpu);
  } else if (name == "cpu-all") {
    every(1, Tier::Cpu);
  } else {
    fail("unknown planner '{}': expected milp, dp, megatrain:K, all-gpu, sqrt or cpu-all", name);
  }
  return t;
}

std::vector<std::string> heuristic_names() { return {"megatrain:4", "all-gpu", "sqrt", "cpu-all"}; }

bool is_heuristic(const std::string& n) {
  return n.rfind("megatrain", 0) == 0 || n == "all-gpu" || n == "sqrt" || n == "cpu-all";
}

std::string canonical_planner(const std::string& name) {
  if (name == "milp" || name == "dp" || name == "all-gpu" || name == "sqrt" || name == "cpu-all") return name;
  if (name == "all-cpu") return "cpu-all";
  if (name == "megatrain") return "megatrain:4";
  if (name.rfind("megatrain:", 0) == 0) {
    int k = 0;
    try {
      size_t used = 0;
      k = std::stoi(name.substr(10), &used);
      LT_CHECK(used == name.size() - 10, "trailing characters");
    } catch (...) {
      fail("unknown planner '{}': K in megatrain:K must be an integer >= 1; planners: {}", name, kPlannerNames);
    }
    LT_CHECK(k >= 1, "planner '{}': K in megatrain:K must be >= 1", name);
    return "megatrain:" + std::to_string(k);
  }
  fail("unknown planner '{}'; planners: {} (aliases: megatrain = megatrain:4, all-cpu = cpu-all)", name, kPlannerNames);
}

}  // namespace lt
