// Small worker pool with a priority queue: the lowest priority value runs first (the optimizer uses the
// unit index, so the unit the next forward needs first is updated first); FIFO among equals.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

namespace lt::optim {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void push(int64_t priority, std::function<void()> fn);
  int size() const { return int(workers_.size()); }

 private:
  struct Task {
    int64_t priority;
    uint64_t seq;
    std::function<void()> fn;
    bool operator<(const Task& o) const {  // std::priority_queue pops the "largest"
      return priority != o.priority ? priority > o.priority : seq > o.seq;
    }
  };
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Task> q_;
  uint64_t seq_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace lt::optim
