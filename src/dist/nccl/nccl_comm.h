// NCCL Communicator: one process per GPU, started by `lazytrain launch -n N` (docs/distributed.md).
// Built only with CUDA (library lt_dist_nccl, macro LT_HAVE_NCCL).
//
// Device buffers go to NCCL directly; host buffers (the CPU master / gradients of the layer-streaming
// executor) are staged through a device scratch buffer in chunks. Equal per-rank ranges use
// ncclReduceScatter / ncclAllGather in place; uneven ranges (shards cut at 8-bit block boundaries) use one
// grouped ncclReduce / ncclBroadcast per root, which NCCL runs concurrently.
#pragma once
#include <memory>

#include "dist/communicator.h"

namespace lt::dist {

class NcclCommunicator final : public Communicator {
 public:
  // Selects GPU env.local_rank, exchanges the NCCL unique id through env.rdzv_dir and joins the group.
  // staging_bytes: device scratch for host-buffer collectives.
  static std::unique_ptr<NcclCommunicator> create(const DistEnv& env, int64_t staging_bytes = int64_t(64) << 20,
                                                  double rdzv_timeout_s = 300);
  ~NcclCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return world_; }
  std::string name() const override { return "nccl"; }
  void all_reduce(void* buf, int64_t n, CommType t) override;
  void reduce_scatter(void* buf, const std::vector<int64_t>& bounds, CommType t) override;
  void all_gather(void* buf, const std::vector<int64_t>& bounds, CommType t) override;
  void broadcast(void* buf, int64_t n, CommType t, int root) override;
  void barrier() override;
  // A collective that does not complete within this (LT_COMM_TIMEOUT_S, default 300 s) aborts the
  // communicator and throws, naming the rank and the collective.
  double timeout_s() const override;
  void set_timeout_s(double s) override;

  struct Impl;

 private:
  NcclCommunicator() = default;
  int rank_ = 0, world_ = 1;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lt::dist
