// Random small planning instances for the planner tests.
#pragma once
#include <functional>
#include <random>

#include "plan/heuristics.h"
#include "plan/instance.h"
#include "plan/plan.h"

namespace lt::test {

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
  in.P = MB * (1.0 + 2 * u(rng));
  in.G = in.P;
  in.P_head = in.P * (0.5 + u(rng));
  in.G_head = in.P_head;
  in.pro_h2d = in.A;
  in.epi_d2h = in.A;
  in.bh = MB * (1.0 + 2 * u(rng));
  in.bd = in.bh * (0.7 + 0.6 * u(rng));
  in.bb = std::max(in.bh, in.bd) + u(rng) * std::min(in.bh, in.bd);
  in.bnr = MB * (0.3 + 1.5 * u(rng));
  in.bnw = MB * (0.3 + 1.5 * u(rng));
  for (int k = 0; k < L + 2; ++k) in.opt.push_back(with_opt ? rho * 1.5 * u(rng) : 0.0);
  in.ring = 2 * in.P;
  in.ws_fwd = 2 * in.A;
  in.ws_bwd = 3 * in.A;
  in.ws_head = in.P_head + in.A;
  in.ws_pro = in.A;
  // HBM room for 2..L+2 boundaries besides the fixed parts.
  in.hbm_cap = in.ring + in.ws_bwd + in.A * (2 + (L + 1) * u(rng));
  in.dram_fixed = 10 * MB;
  in.dram_cap = in.dram_fixed + in.A * ((L + 4) * u(rng));
  in.nvme_cap = in.A * (L * u(rng));
  in.staging = 1;
  in.allow_nvme = u(rng) < 0.8;
  in.micro_batches = 1 + int(3 * u(rng));
  return in;
}

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

}  // namespace lt::test
