#include "dist/data_parallel.h"

#include "core/error.h"
#include "core/timer.h"
#include "model/sequence.h"

namespace lt::dist {

namespace {
struct CommTimer {
  double& acc;
  double t0 = now_seconds();
  ~CommTimer() { acc += now_seconds() - t0; }
};
}  // namespace

ShardedUpdateHook::ShardedUpdateHook(Communicator& comm, HostState& st, ShardLayout shards, optim::CpuAdamW& opt)
    : comm_(comm), st_(st), shards_(std::move(shards)), opt_(opt), pending_(size_t(st.units()), 0),
      stale_(size_t(st.units()), 0) {
  LT_CHECK(st.storage() == MasterStorage::Aliased || st.storage() == MasterStorage::F32Copy,
           "ShardedUpdateHook: the ranks all-gather fp32 masters; build the HostState with fp32_master_array "
           "(it holds {})", master_storage_name(st.storage()));
  LT_CHECK(shards_.world == comm.size(), "ShardedUpdateHook: shard layout for {} ranks, communicator has {}",
           shards_.world, comm.size());
  LT_CHECK(int64_t(shards_.bounds.size()) == st.units(), "ShardedUpdateHook: shard layout has {} units, model state {}",
           shards_.bounds.size(), st.units());
  LT_CHECK(int64_t(opt.units().size()) == st.units(), "ShardedUpdateHook: optimizer has {} units, model state {}",
           opt.units().size(), st.units());
  const int r = comm.rank();
  for (int64_t u = 0; u < st.units(); ++u) {
    LT_CHECK(shards_.bounds[size_t(u)].back() == st.numel(u), "ShardedUpdateHook: unit {} shards cover {} elements, unit has {}",
             u, shards_.bounds[size_t(u)].back(), st.numel(u));
    LT_CHECK(opt.units()[size_t(u)].numel == shards_.hi(u, r) - shards_.lo(u, r),
             "ShardedUpdateHook: unit {} optimizer shard has {} elements, rank {} owns {}", u,
             opt.units()[size_t(u)].numel, r, shards_.hi(u, r) - shards_.lo(u, r));
  }
}

void ShardedUpdateHook::grad_ready(int64_t u, double /*local sumsq: not the sharded one*/) {
  wait(u);  // a unit whose previous update was never waited for (no forward read it): gather it first
  float* g = st_.grad(u);
  const int64_t n = st_.numel(u);
  const auto& b = shards_.bounds[size_t(u)];
  const int r = comm_.rank();
  const int64_t lo = b[size_t(r)], hi = b[size_t(r) + 1];
  double s;
  {
    CommTimer t{comm_s_};
    comm_.reduce_scatter(g, b, CommType::F32);
    comm_bytes_ += n * 4;
    s = comm_.sum(optim::grad_sumsq(g + lo, hi - lo, opt_.isa()));
  }
  optim::UnitBuffers ub;
  ub.master = st_.master(u) + lo;
  ub.grad = g + lo;
  ub.bf16 = st_.aliased() ? nullptr : static_cast<bf16_t*>(st_.stream(u)) + lo;
  opt_.submit(int(u), ub);
  opt_.add_grad_sumsq(int(u), s);
  pending_[size_t(u)] = 1;
}

void ShardedUpdateHook::wait(int64_t u) {
  if (!pending_[size_t(u)]) return;
  opt_.wait(int(u));
  pending_[size_t(u)] = 0;
  CommTimer t{comm_s_};
  const auto& b = shards_.bounds[size_t(u)];
  if (st_.aliased()) {
    comm_.all_gather(st_.master(u), b, CommType::F32);
    comm_bytes_ += st_.numel(u) * 4;
  } else {
    comm_.all_gather(st_.stream(u), b, CommType::BF16);
    comm_bytes_ += st_.numel(u) * 2;
    stale_[size_t(u)] = comm_.size() > 1;
  }
}

void ShardedUpdateHook::sync() {
  for (int64_t u = 0; u < st_.units(); ++u) wait(u);
}

void ShardedUpdateHook::gather_masters() {
  sync();
  CommTimer t{comm_s_};
  for (int64_t u = 0; u < st_.units(); ++u) {
    if (!stale_[size_t(u)]) continue;
    comm_.all_gather(st_.master(u), shards_.bounds[size_t(u)], CommType::F32);
    comm_bytes_ += st_.numel(u) * 4;
    stale_[size_t(u)] = 0;
  }
}

int64_t count_loss_tokens(const std::vector<MicroBatch>& mbs, int64_t T) {
  int64_t n = 0;
  for (const auto& mb : mbs) {
    LT_CHECK(mb.targets, "count_loss_tokens: micro-batch without targets");
    for (int64_t t = 0; t < T; ++t) n += mb.targets[t] != kIgnoreIndex;
  }
  return n;
}

std::vector<MicroBatch> rank_share(const std::vector<MicroBatch>& g, int rank, int world) {
  const int64_t M = int64_t(g.size());
  LT_CHECK(M >= world, "data parallel: the global batch has {} micro-batches, fewer than the {} ranks", M, world);
  const int64_t base = M / world, extra = M % world;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  const int64_t count = base + (rank < extra ? 1 : 0);
  return {g.begin() + begin, g.begin() + begin + count};
}

DistStepResult data_parallel_step(Communicator& comm, Executor& ex, [[maybe_unused]] ShardedUpdateHook& hook,
                                  optim::CpuAdamW& opt, const std::vector<MicroBatch>& mbs, float lr) {
  const ExecPlan& p = ex.plan();
  const int64_t local = count_loss_tokens(mbs, p.batch * p.seq);
  DistStepResult r;
  r.n_tokens = comm.sum(local);
  opt.begin_step(lr);
  r.local = ex.train_step(mbs, r.n_tokens);
  r.step_s = r.local.step_s;
  // loss_r = (sum of rank r's token losses) / local tokens.
  r.loss = r.n_tokens > 0 ? comm.sum(r.local.loss * double(r.local.n_tokens)) / double(r.n_tokens) : comm.sum(0.0);
  r.rows = comm.sum(r.local.rows);
  r.grad_norm = opt.last_step().grad_norm;
  return r;
}

}  // namespace lt::dist
