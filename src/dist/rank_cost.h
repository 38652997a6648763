// How data parallelism enters the planner's inputs (docs/distributed.md, "Planner"):
//  * rank_profile(): the ResourceProfile one rank plans with. Host resources (DRAM, NVMe capacity and
//    bandwidth, host memory bandwidth, CPU optimizer throughput) are shared by the ranks of a host; the
//    GPU, its HBM and its PCIe link are the rank's own (one x16 link per GPU) unless GPUs share a switch.
//    The optimizer rate is scaled by world / ranks_per_host because a rank updates 1/world of the
//    parameters while the planner's optimizer lane charges the whole model at that rate.
//  * step_collectives(): bytes per step and per rank on each lane for the collectives, for the host-
//    staged path that runs today (ShardedUpdateHook over NcclCommunicator with host buffers) and for the
//    device-side path that needs the executor hooks described in the docs.
#pragma once
#include <cstdint>

#include "plan/collectives.h"
#include "plan/profile.h"

namespace lt::dist {

struct Topology {
  int world = 1;                // ranks in all
  int ranks_per_host = 1;       // ranks sharing one host's DRAM, CPU and NVMe
  int gpus_per_pcie_link = 1;   // GPUs behind one upstream PCIe link (1: each has its own x16)
  double link_bw = 0;           // GPU-GPU bytes/s per direction per GPU (NVLink); 0: through PCIe
};

ResourceProfile rank_profile(const ResourceProfile& host, const Topology& t);

enum class CollectivePath { HostStaged, DeviceSide };

struct CollectiveBytes {
  double h2d = 0, d2h = 0;    // extra PCIe bytes per step per rank (beyond the single-GPU plan's traffic)
  double link = 0;            // bytes each GPU sends (= receives) over the GPU-GPU link per step
  double link_s = 0;          // link / link_bw (or / PCIe when link_bw = 0)
  double pcie_saved = 0;      // DeviceSide: single-GPU weight H2D + gradient D2H bytes no longer sent
  // HostStaged: h2d and d2h split by collective (gradient reduce-scatter, weight all-gather), as the
  // planner puts them on the lanes (PlanRequest::collectives).
  StepCollectives lanes;
};
// params: all parameters (fp32 master count); grad_bytes: 4 (fp32 gradients) or 2 (bf16).
CollectiveBytes step_collectives(int64_t params, const Topology& t, const ResourceProfile& p, CollectivePath path,
                                 int grad_bytes = 4);

}  // namespace lt::dist
