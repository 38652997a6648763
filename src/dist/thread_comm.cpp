#include "dist/thread_comm.h"

#include <cstring>
#include <exception>
#include <thread>

#include "core/error.h"

namespace lt::dist {

ThreadGroup::ThreadGroup(int world) : world_(world), slots_(size_t(world), nullptr) {
  LT_CHECK(world >= 1, "ThreadGroup: world size must be >= 1, got {}", world);
}

void ThreadGroup::barrier() {
  std::unique_lock<std::mutex> lk(mu_);
  LT_CHECK(!aborted_, "communicator: another rank failed");
  const int64_t gen = generation_;
  if (++arrived_ == world_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lk, [&] { return generation_ != gen || aborted_; });
  LT_CHECK(!aborted_, "communicator: another rank failed");
}

void ThreadGroup::abort() {
  std::lock_guard<std::mutex> lk(mu_);
  aborted_ = true;
  cv_.notify_all();
}

std::vector<void*>& ThreadCommunicator::publish(void* buf) {
  g_->slots()[size_t(rank_)] = buf;
  g_->barrier();
  return g_->slots();
}


void ThreadCommunicator::reduce_scatter(void* buf, const std::vector<int64_t>& b, CommType t) {
  check_bounds(b, size(), "reduce_scatter");
  LT_CHECK(t != CommType::BF16, "reduce_scatter: bf16 reduction is not supported (reduce in fp32)");
  auto& bufs = publish(buf);
  // Rank r reads every rank's range r and writes only its own buffer's range r: no other rank reads
  // that (they read their own ranges), so one barrier after the writes suffices.
  const int64_t lo = b[size_t(rank_)], hi = b[size_t(rank_) + 1];
  const int64_t es = int64_t(comm_type_size(t));
  std::vector<const char*> src;
  for (void* q : bufs) src.push_back(static_cast<const char*>(q) + lo * es);
  sum_in_rank_order(src, static_cast<char*>(buf) + lo * es, hi - lo, t);
  g_->barrier();
}

void ThreadCommunicator::all_gather(void* buf, const std::vector<int64_t>& b, CommType t) {
  check_bounds(b, size(), "all_gather");
  auto& bufs = publish(buf);
  const size_t es = comm_type_size(t);
  for (int q = 0; q < size(); ++q) {
    if (q == rank_) continue;
    const int64_t lo = b[size_t(q)], hi = b[size_t(q) + 1];
    if (hi > lo)
      std::memcpy(static_cast<char*>(buf) + lo * int64_t(es), static_cast<const char*>(bufs[size_t(q)]) + lo * int64_t(es),
                  size_t(hi - lo) * es);
  }
  g_->barrier();
}

void ThreadCommunicator::all_reduce(void* buf, int64_t n, CommType t) {
  const auto b = even_bounds(n, size());
  reduce_scatter(buf, b, t);
  all_gather(buf, b, t);
}

void ThreadCommunicator::broadcast(void* buf, int64_t n, CommType t, int root) {
  LT_CHECK(root >= 0 && root < size(), "broadcast: root {} out of range [0, {})", root, size());
  auto& bufs = publish(buf);
  if (rank_ != root && n > 0) std::memcpy(buf, bufs[size_t(root)], size_t(n) * comm_type_size(t));
  g_->barrier();
}

void run_ranks(int world, const std::function<void(Communicator&)>& fn) {
  auto g = std::make_shared<ThreadGroup>(world);
  std::vector<std::exception_ptr> errs(static_cast<size_t>(world));
  std::vector<std::thread> th;
  for (int r = 0; r < world; ++r)
    th.emplace_back([&, r] {
      try {
        ThreadCommunicator c(g, r);
        fn(c);
      } catch (...) {
        errs[size_t(r)] = std::current_exception();
        g->abort();
      }
    });
  for (auto& t : th) t.join();
  // Prefer the root cause over the "another rank failed" errors it triggered.
  std::exception_ptr first;
  for (auto& e : errs) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      if (std::string(x.what()).find("another rank failed") == std::string::npos) std::rethrow_exception(e);
    }
    if (!first) first = e;
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace lt::dist
