// Collectives for data-parallel training (docs/distributed.md). One Communicator per rank; every rank
// calls the same collectives in the same order (the executor drives them from one thread per rank).
//
// Implementations:
//   ThreadCommunicator (thread_comm.h)   ranks as threads of one process: the CPU test double for the
//                                        sharding logic; host buffers only.
//   NcclCommunicator   (nccl/nccl_comm.h) one process per GPU (`lazytrain launch`), NCCL from the CUDA
//                                        toolkit; device buffers directly, host buffers staged in chunks.
//
// Reduce-scatter and all-gather work IN PLACE on the whole array with per-rank ranges given by
// `bounds` (W+1 increasing offsets, bounds[0] = 0, bounds[W] = n): rank r owns [bounds[r], bounds[r+1]).
// Ranges may differ in size (shards are cut at 8-bit block boundaries, see shard.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lt::dist {

enum class CommType { F32, F64, I64, BF16 };  // BF16: all-gather/broadcast only (no reduction)
size_t comm_type_size(CommType t);
// out[i] = src[0][i] + src[1][i] + ... in rank order, for i < count (src[q]: rank q's values, already at
// the range's start; F32/F64/I64). One definition for the communicators that sum on the host, so they
// give the same bits.
void sum_in_rank_order(const std::vector<const char*>& src, char* out, int64_t count, CommType t);
const char* comm_type_name(CommType t);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "threads", "nccl"

  // Sum over ranks, in place, n elements.
  virtual void all_reduce(void* buf, int64_t n, CommType t) = 0;
  // After the call, rank r's range of buf holds the sum over ranks of that range; the rest of buf is
  // unspecified (it may hold partial sums).
  virtual void reduce_scatter(void* buf, const std::vector<int64_t>& bounds, CommType t) = 0;
  // After the call, every rank's buf holds every rank's own range.
  virtual void all_gather(void* buf, const std::vector<int64_t>& bounds, CommType t) = 0;
  virtual void broadcast(void* buf, int64_t n, CommType t, int root) = 0;
  virtual void barrier() = 0;
  // This rank is failing with `why`: a communicator that can (ShmCommunicator) makes the peers' waiting
  // collectives fail at once with that message instead of waiting for a timeout.
  virtual void abort(const std::string& why) { (void)why; }
  // The longest this rank waits in one collective for the others, seconds; 0: no bound of ours (the
  // transport's own). A phase where one rank is known to work alone for long (rank 0 writing a
  // checkpoint) raises it for its duration (ScopedCommTimeout).
  virtual double timeout_s() const { return 0; }
  virtual void set_timeout_s(double s) { (void)s; }

  // Convenience scalars.
  double sum(double x) {
    all_reduce(&x, 1, CommType::F64);
    return x;
  }
  int64_t sum(int64_t x) {
    all_reduce(&x, 1, CommType::I64);
    return x;
  }
};

// Raises the communicator's timeout to at least `at_least` seconds until destroyed (if it has one).
class ScopedCommTimeout {
 public:
  ScopedCommTimeout(Communicator& c, double at_least) : c_(c), saved_(c.timeout_s()) {
    if (saved_ > 0 && at_least > saved_) c_.set_timeout_s(at_least);
  }
  ~ScopedCommTimeout() {
    if (saved_ > 0) c_.set_timeout_s(saved_);
  }
  ScopedCommTimeout(const ScopedCommTimeout&) = delete;
  ScopedCommTimeout& operator=(const ScopedCommTimeout&) = delete;

 private:
  Communicator& c_;
  double saved_;
};

// The communicator of a single-rank run (every collective is the identity): lets a trainer use the
// data-parallel path unconditionally. Multi-rank: NcclCommunicator::create (CUDA builds).
std::unique_ptr<Communicator> solo_communicator();

// Checks bounds for `world` ranks (throws lt::Error naming the problem).
void check_bounds(const std::vector<int64_t>& bounds, int world, const char* op);
// Equal ranges (the last one shorter) of n elements over world ranks.
std::vector<int64_t> even_bounds(int64_t n, int world);

// The launcher's environment (cmd_launch.cpp): LT_RANK, LT_WORLD_SIZE, LT_LOCAL_RANK, LT_RDZV_DIR.
struct DistEnv {
  int rank = 0, world = 1, local_rank = 0;
  std::string rdzv_dir;   // rendezvous directory (file exchange of the NCCL unique id)
  bool launched = false;  // LT_WORLD_SIZE was set
};
// Reads and validates the variables (a clear error for a malformed or inconsistent value).
DistEnv dist_env_from_environment();
// The collective timeout of a rank: LT_COMM_TIMEOUT_S when set (a positive number, else lt::Error),
// else 300 s (`lazytrain launch --comm-timeout`).
double comm_timeout_from_environment();

}  // namespace lt::dist
