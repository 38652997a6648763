// In-process Communicator: ranks are threads of one process sharing a ThreadGroup. A CPU test double
// for the data-parallel logic (sharding, reduce-scatter, all-gather, resume across world sizes), not a
// transport: buffers are read directly across threads between two barriers.
//
// Sums are taken in rank order (rank 0 + rank 1 + ...), whichever rank owns the range, so results are
// deterministic and independent of thread timing.
//
//   dist::run_ranks(3, [&](dist::Communicator& c) { ... c.all_reduce(...) ...; });
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "dist/communicator.h"

namespace lt::dist {

class ThreadGroup {
 public:
  explicit ThreadGroup(int world);
  int world() const { return world_; }
  // Blocks until all ranks arrived; throws lt::Error if the group was aborted (a rank failed).
  void barrier();
  // Wakes every waiting rank with an error (called when a rank's function throws).
  void abort();
  std::vector<void*>& slots() { return slots_; }

 private:
  int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<void*> slots_;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->world(); }
  std::string name() const override { return "threads"; }
  void all_reduce(void* buf, int64_t n, CommType t) override;
  void reduce_scatter(void* buf, const std::vector<int64_t>& bounds, CommType t) override;
  void all_gather(void* buf, const std::vector<int64_t>& bounds, CommType t) override;
  void broadcast(void* buf, int64_t n, CommType t, int root) override;
  void barrier() override { g_->barrier(); }

 private:
  std::vector<void*>& publish(void* buf);  // all ranks' buffers, after a barrier
  std::shared_ptr<ThreadGroup> g_;
  int rank_;
};

// Runs fn on `world` threads, one ThreadCommunicator each; rethrows the first failure (the other ranks
// are released from their barriers with an error).
void run_ranks(int world, const std::function<void(Communicator&)>& fn);

}  // namespace lt::dist
