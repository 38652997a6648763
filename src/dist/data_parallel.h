// Data-parallel training step on top of the layer-streaming executor (docs/distributed.md).
//
// Each rank holds the full fp32 master and streaming copy (HostState, as in a single-process run) but the
// optimizer state of its shard only (shard.h): a CpuAdamW built from rank_unit_specs(). Per step:
//   1. the global count of loss tokens is all-reduced;
//   2. the executor runs forward/backward on this rank's micro-batches (its share of the global batch),
//      normalising the gradient by the global count (Executor::train_step's loss_tokens), as one process
//      running the whole global batch normalises each of its micro-batches;
//   3. ShardedUpdateHook::grad_ready(u): unit u's gradient is reduce-scattered (rank r receives the sum of
//      range r, taken in rank order: with one micro-batch per rank, the order in which one process
//      accumulates its micro-batches), the shard's sum of squares is all-reduced (exact global-norm
//      clipping needs the total), and the shard update is queued;
//   4. ShardedUpdateHook::wait(u) (the next forward needs unit u): the shard update finishes and the
//      updated streaming copy is all-gathered: the fp32 master when it is the streaming copy (CPU
//      backend), else the bf16 copy only. In the bf16 case each rank's master is then current only in
//      its own range (the only range its optimizer updates); gather_masters() makes all of it current
//      (checkpoints, anything reading masters), at 4 bytes per parameter instead of every step.
// All collectives are issued from the executor's thread in unit order, identical on every rank.
#pragma once
#include <cstdint>
#include <vector>

#include "dist/communicator.h"
#include "dist/shard.h"
#include "exec/executor.h"
#include "optim/optimizer.h"

namespace lt::dist {

// The host state of a data-parallel rank: fp32 master arrays (the ranks all-gather fp32; the split
// 4 B master of single-GPU runs is not supported here yet).
inline HostStateOptions dp_host_state() {
  HostStateOptions o;
  o.fp32_master_array = true;
  return o;
}

class ShardedUpdateHook final : public UpdateHook {
 public:
  ShardedUpdateHook(Communicator& comm, HostState& st, ShardLayout shards, optim::CpuAdamW& shard_opt);
  // unit's host gradient is this rank's part of the global batch's gradient (normalised by the global
  // batch's loss tokens): the ranks' parts are summed.
  void grad_ready(int64_t unit, double sumsq) override;
  void wait(int64_t unit) override;
  bool rewrites_host_gradients() const override { return true; }  // reduce-scattered in place
  // Finishes every pending update and all-gather of the streaming copies.
  void sync();
  // sync(), then all-gathers the master ranges other ranks updated (bf16 streaming only): afterwards
  // HostState::master(u) is current everywhere. Call before reading masters (checkpoint, export).
  void gather_masters();
  const ShardLayout& shards() const { return shards_; }
  double comm_seconds() const { return comm_s_; }  // cumulative time in collectives (this rank)
  int64_t comm_bytes() const { return comm_bytes_; }  // cumulative bytes this rank passed to collectives

 private:
  Communicator& comm_;
  HostState& st_;
  ShardLayout shards_;
  optim::CpuAdamW& opt_;
  std::vector<char> pending_;  // unit's update submitted, all-gather not done yet
  std::vector<char> stale_;    // master outside this rank's range is out of date (bf16 streaming)
  double comm_s_ = 0;
  int64_t comm_bytes_ = 0;
};

struct DistStepResult {
  double loss = 0;         // global: sum of token losses over all ranks / global tokens
  int64_t n_tokens = 0;    // global loss tokens
  int64_t rows = 0;        // global tokens incl. padding
  double grad_norm = 0;    // global, before clipping (from the optimizer's decision)
  double step_s = 0;       // this rank's train_step wall time
  StepResult local;        // this rank's executor result
};

// Non-ignored targets of micro-batches of `tokens_per_mb` tokens.
int64_t count_loss_tokens(const std::vector<MicroBatch>& mbs, int64_t tokens_per_mb);
// The micro-batches of rank r when the global batch is `global_mbs` micro-batches: a contiguous slice,
// as even as possible (ranks [0, M mod W) get one more). Requires M >= W.
std::vector<MicroBatch> rank_share(const std::vector<MicroBatch>& global_mbs, int rank, int world);

// One optimizer step of the rank: token all-reduce, opt.begin_step(lr), executor step (normalised by the
// global loss tokens; `hook` is the executor's update hook, which sums the ranks' gradients), global loss.
DistStepResult data_parallel_step(Communicator& comm, Executor& ex, ShardedUpdateHook& hook, optim::CpuAdamW& opt,
                                  const std::vector<MicroBatch>& my_mbs, float lr);

}  // namespace lt::dist
