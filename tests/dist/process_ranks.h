// Test helper: runs a function on W ranks as forked processes, each with a ShmCommunicator over a
// fresh rendezvous directory (what `lazytrain launch` gives the ranks of `lazytrain train`).
// A child exits 0 when fn returned without a GoogleTest failure, 1 on a test failure, 3 on an
// exception (printed, and recorded for the peers with abort()); fn may also _exit() with its own code
// (a "dying" rank).
#pragma once
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include "core/timer.h"
#include "dist/shm_comm.h"

namespace lt::dist::testing {

struct ProcessRun {
  std::vector<int> codes;  // per rank: exit code, 128 + signal, or -1 if killed at the deadline
  double seconds = 0;      // until the last rank ended
};

inline ShmCommOptions test_comm_options(double timeout_s = 10, int64_t slot_bytes = int64_t(4) << 20) {
  ShmCommOptions o;
  o.timeout_s = timeout_s;
  o.slot_bytes = slot_bytes;
  return o;
}

// deadline_s: ranks still running then are SIGKILLed (code -1).
inline ProcessRun run_rank_processes(int world, const std::function<void(Communicator&)>& fn,
                                     const ShmCommOptions& o = test_comm_options(), double deadline_s = 60) {
  std::string dir = (std::filesystem::temp_directory_path() / "lt-shm-test-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      std::unique_ptr<ShmCommunicator> c;
      try {
        DistEnv env;
        env.rank = r;
        env.world = world;
        env.local_rank = r;
        env.rdzv_dir = dir;
        env.launched = true;
        ::setenv("LT_RDZV_DIR", dir.c_str(), 1);  // as under `lazytrain launch`
        c = ShmCommunicator::create(env, o);
        fn(*c);
        code = ::testing::Test::HasFailure() ? 1 : 0;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        if (c) c->abort(e.what());  // what the trainer does: the peers stop with this message
        code = 3;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  ProcessRun run;
  run.codes.assign(size_t(world), -1);
  const double t0 = now_seconds();
  int live = world;
  while (live > 0) {
    bool reaped = false;
    for (int r = 0; r < world; ++r) {
      int st = 0;
      if (pids[size_t(r)] > 0 && ::waitpid(pids[size_t(r)], &st, WNOHANG) == pids[size_t(r)]) {
        run.codes[size_t(r)] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        pids[size_t(r)] = -1;
        --live;
        reaped = true;
      }
    }
    if (reaped) continue;
    if (now_seconds() - t0 > deadline_s) {
      for (int r = 0; r < world; ++r)
        if (pids[size_t(r)] > 0) {
          ::kill(pids[size_t(r)], SIGKILL);
          ::waitpid(pids[size_t(r)], nullptr, 0);
          pids[size_t(r)] = -1;
          --live;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  run.seconds = now_seconds() - t0;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return run;
}

}  // namespace lt::dist::testing
