// Random small planning instances for the planner tests.
#pragma once
#include "../common/repo_path.h"
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "core/error.h"
#include "plan/heuristics.h"
#include "plan/instance.h"
#include "model/model_config.h"
#include "plan/plan.h"
#include "plan/planner.h"
#include "plan/profile.h"
#include "plan/simulator.h"

namespace lt::test {

// tiny-qwen3 (hidden 64, 2 layers, untied) at batch 1 x 64 on the h200 profile with a DRAM budget: the
// model-state placement tests' request.
inline PlanRequest tiny_state_request(double dram) {
  PlanRequest r;
  r.model = preset_config("tiny-qwen3");
  r.batch = 1;
  r.seq = 64;
  r.profile = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h200.json");
  r.profile.dram_bytes = int64_t(dram);
  r.milp.time_limit_s = 10;
  return r;
}

// A 2-layer instance with round numbers, checked against hand computation of the slot rules.
inline Instance two_layer_instance() {
  Instance in;
  in.L = 2;
  in.rho = {1.0, 1.0};
  in.beta = {3.0, 3.0};
  in.head_s = 2.0;
  in.A = 10;
  in.P = {20, 20};
  in.G = {20, 20};
  in.P_head = 40;
  in.G_head = 40;
  in.pro_h2d = 10;
  in.epi_d2h = 10;
  in.bh = 10;   // 20 bytes of weights take 2 s: weights are exposed in every slot
  in.bd = 10;
  in.bb = 15;   // both ways at once: 15 B/s in total
  in.bnr = 5;
  in.bnw = 5;
  in.opt = {0, 0, 0, 0};
  in.ring = 40;
  in.ws_fwd = {1, 1};
  in.ws_bwd = {2, 2};
  in.ws_head = 3;
  in.ws_pro = 10;
  in.hbm_cap = 1000;
  in.dram_cap = 1000;
  in.dram_fixed = 100;
  in.nvme_cap = 1000;
  return in;
}

// Times in ms-ish units, bytes in MB-ish units; bandwidths chosen so transfers are comparable to
// compute (some hidden, some exposed); capacities so that memory binds in some instances.
inline Instance random_instance(std::mt19937& rng, int L, bool with_opt = true) {
  std::uniform_real_distribution<double> u(0, 1);
  Instance in;
  in.L = L;
  const double rho = 1.0 + u(rng);
  for (int j = 0; j < L; ++j) {
    in.rho.push_back(rho * (0.8 + 0.4 * u(rng)));
    in.beta.push_back(in.rho.back() * (2.5 + u(rng)));
  }
  in.head_s = rho * (0.5 + u(rng));
  const double MB = 1e6;  // bytes and bandwidths in MB so memory checks are not rounding noise
  in.A = MB * (1.0 + u(rng));
  const double P = MB * (1.0 + 2 * u(rng));
  in.P.assign(size_t(L), P);
  in.G = in.P;
  in.P_head = P * (0.5 + u(rng));
  in.G_head = in.P_head;
  in.pro_h2d = in.A;
  in.epi_d2h = in.A;
  in.bh = MB * (1.0 + 2 * u(rng));
  in.bd = in.bh * (0.7 + 0.6 * u(rng));
  in.bb = std::max(in.bh, in.bd) + u(rng) * std::min(in.bh, in.bd);
  in.bnr = MB * (0.3 + 1.5 * u(rng));
  in.bnw = MB * (0.3 + 1.5 * u(rng));
  for (int k = 0; k < L + 2; ++k) in.opt.push_back(with_opt ? rho * 1.5 * u(rng) : 0.0);
  in.ring = 2 * P;
  in.ws_fwd.assign(size_t(L), 2 * in.A);
  in.ws_bwd.assign(size_t(L), 3 * in.A);
  in.ws_head = in.P_head + in.A;
  in.ws_pro = in.A;
  // HBM room for 2..L+2 boundaries besides the fixed parts.
  in.hbm_cap = in.ring + 3 * in.A + in.A * (2 + (L + 1) * u(rng));
  in.dram_fixed = 10 * MB;
  in.dram_cap = in.dram_fixed + in.A * ((L + 4) * u(rng));
  in.nvme_cap = in.A * (L * u(rng));
  in.staging = 1;
  in.allow_nvme = u(rng) < 0.8;
  in.micro_batches = 1 + int(3 * u(rng));
  return in;
}

// Layer kinds for a test: Qwen3.5's pattern (three DeltaNet layers, then one attention layer) or a
// random order (at least one layer of each kind when L >= 2).
inline std::vector<LayerKind> test_kinds(std::mt19937& rng, int L, bool random_order) {
  std::vector<LayerKind> k(static_cast<size_t>(L));
  for (int j = 0; j < L; ++j)
    k[size_t(j)] = random_order ? LayerKind(rng() % 2) : ((j + 1) % 4 ? LayerKind::GatedDeltaNet : LayerKind::Attention);
  if (random_order && L >= 2) {
    k[rng() % size_t(L)] = LayerKind::Attention;
    for (int j = 0; j < L; ++j)
      if (k[size_t(j)] == LayerKind::Attention) {
        k[size_t((j + 1 + rng() % size_t(L - 1)) % size_t(L))] = LayerKind::GatedDeltaNet;
        break;
      }
  }
  return k;
}

// Makes the layers of a random instance unlike: each kind gets its own forward/backward time,
// weights, gradient and working sets (attention: fewer weights, larger working sets; DeltaNet the
// reverse), so that per-layer mistakes (a scalar P, the last layer's workspace for every slot, ...)
// change the optimum. The ring and the HBM cap follow the largest layer.
inline void make_hybrid(Instance& in, std::mt19937& rng, const std::vector<LayerKind>& kinds) {
  std::uniform_real_distribution<double> u(0, 1);
  const double MB = 1e6, A = in.A, rho = in.rho[0];
  struct K {
    double rho, beta, P, ws_fwd, ws_bwd;
  };
  const K att{rho * (1.2 + u(rng)), 0, MB * (0.5 + u(rng)), A * (2.5 + 2 * u(rng)), A * (3 + 3 * u(rng))};
  const K dn{rho * (0.5 + 0.5 * u(rng)), 0, MB * (1.5 + 2 * u(rng)), A * (0.5 + u(rng)), A * (1 + u(rng))};
  const double batt = att.rho * (2.5 + u(rng)), bdn = dn.rho * (2 + u(rng));
  in.kind = kinds;
  in.rho.clear(), in.beta.clear(), in.P.clear(), in.ws_fwd.clear(), in.ws_bwd.clear();
  for (LayerKind k : kinds) {
    const K& x = k == LayerKind::Attention ? att : dn;
    in.rho.push_back(x.rho);
    in.beta.push_back(k == LayerKind::Attention ? batt : bdn);
    in.P.push_back(x.P);
    in.ws_fwd.push_back(x.ws_fwd);
    in.ws_bwd.push_back(x.ws_bwd);
  }
  in.G = in.P;
  in.ring = 2 * std::max(att.P, dn.P);
  in.hbm_cap = in.ring + in.max_ws_bwd() + A * (2 + (in.L + 1) * u(rng));
}

// A small instance of a real hybrid shape: tiny-qwen35 with L layers in a random kind order, costs from
// the model accounting and the h200 profile; then the HBM cap and the PCIe/NVMe rates scaled so that
// memory binds and transfers are comparable to compute (the tiny shape would otherwise fit anything).
inline Instance tiny_hybrid_instance(std::mt19937& rng, int L) {
  std::uniform_real_distribution<double> u(0, 1);
  ModelConfig c = preset_config("tiny-qwen35");
  c.layers = L;
  c.layer_kinds = test_kinds(rng, L, true);
  const auto prof = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h200.json");
  InstanceOptions o;
  o.micro_batches = 1 + int(2 * u(rng));
  Instance in = make_instance(c, 4, 64, prof, o);
  const double bw = in.P[0] / in.rho[0] * (0.5 + u(rng));  // one layer's weights in about one forward
  in.bh = bw;
  in.bd = bw * (0.7 + 0.6 * u(rng));
  in.bb = std::max(in.bh, in.bd) * 1.5;
  in.bnr = in.bnw = bw * (0.3 + u(rng));
  in.hbm_cap = in.hbm_fixed + in.ring + in.max_ws_bwd() + in.A * (2 + (L + 1) * u(rng));
  in.dram_cap = in.dram_fixed + in.A * (L * u(rng));
  in.nvme_cap = in.A * L;
  in.staging = 1;
  const double opt_scale = 1.5 * in.rho[0] * u(rng) / *std::max_element(in.opt.begin(), in.opt.end());
  for (auto& t : in.opt) t *= opt_scale;  // the CPU optimizer comparable to a layer, per-unit ratios kept
  return in;
}

// The best plan of the tied space by brute force, scored by the simulator: the step time with
// optimizer waits, or without them (the DP's objective). Infinite when nothing fits.
struct BruteForce {
  double best = INFINITY;
  std::vector<Tier> tier;
};
inline Plan plan_for(const Instance& in, std::vector<Tier> tier) {
  Plan p;
  p.model = "test";
  p.layers = in.L;
  p.hidden = 8;
  p.vocab = 16;
  p.batch = 1;
  p.seq = 4;
  p.chunk = 1;
  p.tier = std::move(tier);
  assign_tied_traffic(in, p);
  return p;
}

// Calls f for every tier vector (boundaries 1..L-1 over none/gpu/cpu/nvme).
inline void for_all_tiers(int L, const std::function<void(const std::vector<Tier>&)>& f) {
  std::vector<Tier> t(size_t(L + 1), Tier::None);
  t[0] = t[size_t(L)] = Tier::Gpu;
  long long n = 1;
  for (int i = 1; i < L; ++i) n *= 4;
  for (long long k = 0; k < n; ++k) {
    long long x = k;
    for (int i = 1; i < L; ++i, x /= 4) t[size_t(i)] = Tier(x % 4);
    f(t);
  }
}

inline BruteForce best_tied_plan(const Instance& in, bool without_optimizer) {
  BruteForce b;
  for_all_tiers(in.L, [&](const std::vector<Tier>& t) {
    if (!in.allow_nvme && std::count(t.begin(), t.end(), Tier::Nvme) > 0) return;
    Plan p;
    try {
      p = plan_for(in, t);
    } catch (const Error&) {
      return;  // nvme boundary without a write window
    }
    auto r = simulate(in, p);
    const double v = without_optimizer ? r.step_no_opt_s : r.pred.step_s;
    if (r.fits && v < b.best) {
      b.best = v;
      b.tier = t;
    }
  });
  return b;
}

}  // namespace lt::test
