#include "optim/thread_pool.h"

namespace lt::optim {

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) threads = 1;
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::push(int64_t priority, std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    q_.push(Task{priority, seq_++, std::move(fn)});
  }
  cv_.notify_one();
}

void ThreadPool::loop() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // stop requested and drained
      fn = std::move(const_cast<Task&>(q_.top()).fn);
      q_.pop();
    }
    fn();  // tasks catch their own exceptions
  }
}

}  // namespace lt::optim
