// Communicator for ranks as processes of one host (`lazytrain launch -n N` on the CPU backend).
//
// Rank 0 creates a POSIX shared memory object (/dev/shm; where shm_open is unavailable, a file in the
// rendezvous directory), initialises it, then publishes its name under `<LT_RDZV_DIR>/<key>`
// (rendezvous.h), so the others never map a half-initialised one; every rank maps it and rank 0
// removes it once all ranks joined (nothing is left behind, whatever happens later). The segment
// holds a barrier and one staging slot of `slot_bytes` per rank; collectives move data through the
// slots in rounds of at most one slot per rank, with two barriers per round.
//
// Sums are taken in rank order (rank 0 + rank 1 + ...), as in ThreadCommunicator: results are
// deterministic and bit-identical to the thread communicator's.
//
// Bounded waits: a rank waiting in a collective fails with lt::Error, naming the collective and the
// ranks concerned,
//   - at once when a peer recorded a failure (a rank that throws out of a collective, or whose
//     communicator is destroyed by an exception, records its message);
//   - within ~0.1 s when a peer process no longer exists (or is a zombie);
//   - after timeout_s when peers are alive but do not arrive (hung).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace lt::dist {

struct ShmCommOptions {
  double timeout_s = 300;                 // longest wait in one collective (and for the rendezvous)
  int64_t slot_bytes = int64_t(4) << 20;  // staging per rank
  std::string key = "cpu-comm";           // entry in the rendezvous directory
};

class ShmCommunicator final : public Communicator {
 public:
  // Collective over env.world ranks: rank 0 creates the segment and publishes it in env.rdzv_dir, the
  // others wait for it (up to o.timeout_s), then all ranks meet in a first barrier.
  static std::unique_ptr<ShmCommunicator> create(const DistEnv& env, const ShmCommOptions& o = {});
  // Destroyed while an exception propagates: records a failure so that peers stop at once.
  ~ShmCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  std::string name() const override { return "shm"; }
  void all_reduce(void* buf, int64_t n, CommType t) override;
  void reduce_scatter(void* buf, const std::vector<int64_t>& bounds, CommType t) override;
  void all_gather(void* buf, const std::vector<int64_t>& bounds, CommType t) override;
  void broadcast(void* buf, int64_t n, CommType t, int root) override;
  void barrier() override { sync("barrier"); }

  // Records that this rank failed (the first failure of the group is kept): peers waiting in, or
  // entering, a collective throw an error quoting `why`.
  void abort(const std::string& why) override;
  double timeout_s() const override { return timeout_s_; }
  void set_timeout_s(double s) override { timeout_s_ = s; }

  struct Shared;

 private:
  ShmCommunicator() = default;
  void sync(const char* op);  // barrier with the failure / death / timeout checks
  [[noreturn]] void fail_collective(const char* op, const std::string& what);
  char* slot(int r) const;
  // The collectives, with the name errors give (all_reduce is a reduce-scatter and an all-gather).
  void reduce_scatter_as(void* buf, const std::vector<int64_t>& bounds, CommType t, const char* op);
  void all_gather_as(void* buf, const std::vector<int64_t>& bounds, CommType t, const char* op);

  int rank_ = 0, world_ = 1;
  double timeout_s_ = 300;
  int64_t slot_bytes_ = 0, map_bytes_ = 0;
  int64_t syncs_ = 0;  // barriers this rank passed (equal on every rank between collectives)
  Shared* sh_ = nullptr;
  char* slots_ = nullptr;
};

}  // namespace lt::dist
