// A host thread that runs jobs in order (the NVMe lane, the gradient sink). submit() returns a
// future that carries the job's exception, if any.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

namespace lt {

class HostWorker {
 public:
  explicit HostWorker(std::string name);
  ~HostWorker();  // runs the queued jobs, then joins
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;
  std::shared_future<void> submit(std::function<void()> job);
  void drain();  // returns when every submitted job has finished
  const std::string& name() const { return name_; }

 private:
  void loop();
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> q_;
  int64_t busy_ = 0;
  bool stop_ = false;
  std::thread th_;
};

}  // namespace lt
