#include "exec/host_worker.h"

namespace lt {

HostWorker::HostWorker(std::string name) : name_(std::move(name)) { th_ = std::thread([this] { loop(); }); }

HostWorker::~HostWorker() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  th_.join();
}

std::shared_future<void> HostWorker::submit(std::function<void()> job) {
  std::packaged_task<void()> t(std::move(job));
  std::shared_future<void> f = t.get_future().share();
  {
    std::lock_guard<std::mutex> g(mu_);
    q_.push_back(std::move(t));
  }
  cv_.notify_all();
  return f;
}

void HostWorker::drain() {
  std::unique_lock<std::mutex> g(mu_);
  cv_.wait(g, [&] { return q_.empty() && busy_ == 0; });
}

void HostWorker::loop() {
  for (;;) {
    std::packaged_task<void()> t;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;
      t = std::move(q_.front());
      q_.pop_front();
      busy_++;
    }
    t();  // exceptions are stored in the future
    {
      std::lock_guard<std::mutex> g(mu_);
      busy_--;
    }
    cv_.notify_all();
  }
}

}  // namespace lt
