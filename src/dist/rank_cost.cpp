#include "dist/rank_cost.h"

#include "core/error.h"

namespace lt::dist {

ResourceProfile rank_profile(const ResourceProfile& host, const Topology& t) {
  LT_CHECK(t.world >= 1 && t.ranks_per_host >= 1 && t.ranks_per_host <= t.world && t.gpus_per_pcie_link >= 1,
           "rank_profile: bad topology world {} ranks_per_host {} gpus_per_pcie_link {}", t.world, t.ranks_per_host,
           t.gpus_per_pcie_link);
  ResourceProfile p = host;
  const double k = double(t.ranks_per_host);
  p.dram_bytes = host.dram_bytes / t.ranks_per_host;
  p.nvme_bytes = host.nvme_bytes / t.ranks_per_host;
  p.nvme_read_bw = host.nvme_read_bw / k;
  p.nvme_write_bw = host.nvme_write_bw / k;
  p.host_mem_bw = host.host_mem_bw / k;
  p.opt_fp32_params_per_s = host.opt_fp32_params_per_s * double(t.world) / k;
  p.opt_8bit_params_per_s = host.opt_8bit_params_per_s * double(t.world) / k;
  const double g = double(t.gpus_per_pcie_link);
  p.h2d_bw = host.h2d_bw / g;
  p.d2h_bw = host.d2h_bw / g;
  p.both_bw = host.both_bw / g;
  p.name = host.name + (t.world > 1 ? "/rank-of-" + std::to_string(t.world) : "");
  return p;
}

CollectiveBytes step_collectives(int64_t params, const Topology& t, const ResourceProfile& p, CollectivePath path,
                                 int grad_bytes) {
  LT_CHECK(grad_bytes == 2 || grad_bytes == 4, "step_collectives: grad_bytes must be 2 or 4, got {}", grad_bytes);
  CollectiveBytes c;
  if (t.world == 1) return c;
  const double P = double(params), W = double(t.world), ring = (W - 1) / W;
  if (path == CollectivePath::HostStaged) {
    // reduce-scatter of the fp32 host gradient: H2D all of it, D2H the own range;
    // all-gather of the bf16 streaming copy: H2D the own range, D2H all of it (fp32 masters are
    // gathered only for checkpoints, not counted per step).
    c.lanes.grad_h2d = 4 * P;
    c.lanes.grad_d2h = 4 * P / W;
    c.lanes.weight_h2d = 2 * P / W;
    c.lanes.weight_d2h = 2 * P;
    c.h2d = c.lanes.h2d();
    c.d2h = c.lanes.d2h();
    c.link = 4 * P * ring + 2 * P * ring;
  } else {
    // Gradient reduce-scattered on the GPU before the offload (D2H only the own range); weights: H2D the
    // own bf16 range, all-gathered over the link into the weight ring. Per streamed pass of the weights.
    c.link = double(grad_bytes) * P * ring + 2 * P * ring;
    c.pcie_saved = double(grad_bytes) * P * ring + 2 * P * ring;
  }
  const double bw = t.link_bw > 0 ? t.link_bw : p.h2d_bw;
  c.link_s = bw > 0 ? c.link / bw : 0;
  return c;
}

}  // namespace lt::dist
