#include "dist/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "dist/rendezvous.h"

namespace lt::dist {
namespace fs = std::filesystem;

namespace {
volatile sig_atomic_t g_signal = 0;
void on_signal(int s) { g_signal = s; }

struct SignalGuard {  // forwards SIGINT/SIGTERM while the ranks run
  struct sigaction old_int {}, old_term {};
  SignalGuard() {
    g_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
  }
  ~SignalGuard() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
};

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}
}  // namespace

int launch(const LaunchOptions& o) {
  LT_CHECK(o.n >= 1, "launch: -n must be >= 1, got {}", o.n);
  LT_CHECK(!o.argv.empty(), "launch: no command given (usage: lazytrain launch -n N -- <subcommand> <args>)");
  std::string dir = o.rdzv_dir;
  std::optional<RendezvousDir> own;  // removed when launch returns or throws
  if (dir.empty()) {
    const fs::path parent = fs::temp_directory_path();
    for (const auto& p : remove_stale_rendezvous_dirs(parent))
      log_info("launch: removed {}, the rendezvous directory of a launch that was killed", p.string());
    own.emplace(RendezvousDir::create(parent));
    dir = own->path().string();
  } else {
    fs::create_directories(dir);
  }
  const int dir_lock_fd = own ? own->lock_fd() : -1;
  const pid_t launcher = ::getpid();
  std::vector<char*> args;
  for (auto& a : o.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  SignalGuard guard;
  std::vector<pid_t> pids(size_t(o.n), -1);
  std::vector<int> codes(size_t(o.n), -1);
  // SIGINT/SIGTERM stay blocked across fork until the child has reset its handlers: a signal sent to a
  // child that early would otherwise run the launcher's handler copy and be lost.
  sigset_t block, saved;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  for (int r = 0; r < o.n; ++r) {
    ::sigprocmask(SIG_BLOCK, &block, &saved);
    const pid_t pid = ::fork();
    if (pid != 0) ::sigprocmask(SIG_SETMASK, &saved, nullptr);
    LT_CHECK(pid >= 0, "launch: fork failed for rank {}: {}", r, std::strerror(errno));
    if (pid == 0) {
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      // Own process group: a terminal's Ctrl-C reaches the launcher only, which forwards it once.
      ::setpgid(0, 0);
      // The ranks die with the launcher (even if it is SIGKILLed).
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(1);  // the launcher already died
      // The rank keeps the rendezvous directory's lock: no later launch removes it while a rank lives.
      if (dir_lock_fd >= 0) ::fcntl(dir_lock_fd, F_SETFD, 0);
      ::sigprocmask(SIG_SETMASK, &saved, nullptr);
      const std::string rank = std::to_string(r), world = std::to_string(o.n);
      setenv("LT_RANK", rank.c_str(), 1);
      setenv("LT_LOCAL_RANK", rank.c_str(), 1);
      setenv("LT_WORLD_SIZE", world.c_str(), 1);
      setenv("LT_LOCAL_WORLD_SIZE", world.c_str(), 1);
      setenv("LT_RDZV_DIR", dir.c_str(), 1);
      ::execvp(args[0], args.data());
      std::fprintf(stderr, "lazytrain launch: rank %d: cannot run %s: %s\n", r, args[0], std::strerror(errno));
      ::_exit(127);
    }
    pids[size_t(r)] = pid;
  }
  int first_fail = 0, failed_rank = -1, live = o.n;
  double kill_at = -1;
  while (live > 0) {
    int status = 0;
    const pid_t p = ::waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < o.n; ++r)
        if (pids[size_t(r)] == p) {
          codes[size_t(r)] = exit_code(status);
          pids[size_t(r)] = -1;
          --live;
          if (codes[size_t(r)] == 0) continue;
          // Every failure is reported (two ranks may end in the same poll, the root cause second).
          const std::string how = WIFSIGNALED(status)
                                      ? fmt::format("was killed by signal {} ({}), exit code {}", WTERMSIG(status),
                                                    strsignal(WTERMSIG(status)), codes[size_t(r)])
                                      : fmt::format("exited with code {}", codes[size_t(r)]);
          if (failed_rank >= 0) {
            log_warn("launch: rank {} {}", r, how);
            continue;
          }
          failed_rank = r;
          first_fail = codes[size_t(r)];
          log_warn("launch: rank {} {}; stopping the other ranks", r, how);
          for (pid_t q : pids)
            if (q > 0) ::kill(q, SIGTERM);
          kill_at = now_seconds() + o.grace_s;
        }
      continue;
    }
    if (g_signal) {
      for (pid_t q : pids)
        if (q > 0) ::kill(q, g_signal);
      g_signal = 0;
    }
    if (kill_at > 0 && now_seconds() > kill_at) {
      for (pid_t q : pids)
        if (q > 0) ::kill(q, SIGKILL);
      kill_at = -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return first_fail;
}

}  // namespace lt::dist
