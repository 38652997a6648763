// `lazytrain launch -n N -- <args>`: starts N copies of a command, one per GPU of this host, each with
//   LT_RANK, LT_LOCAL_RANK (= rank, one host), LT_WORLD_SIZE, LT_LOCAL_WORLD_SIZE and LT_RDZV_DIR (a fresh
//   temporary directory where rank 0 publishes the NCCL unique id, see rendezvous.h);
// waits for all; when one fails (non-zero exit or a signal) the others get SIGTERM, then SIGKILL after a
// grace period. SIGINT/SIGTERM to the launcher are forwarded to the ranks (they checkpoint and stop);
// the ranks run in their own process group (a terminal's Ctrl-C reaches them once, through the
// launcher) and get SIGTERM if the launcher dies. The rendezvous directory is removed when the launch
// ends; one left by a launch killed with SIGKILL is removed by the next launch once its ranks have
// ended (rendezvous.h, RendezvousDir).
#pragma once
#include <string>
#include <vector>

namespace lt::dist {

struct LaunchOptions {
  int n = 1;
  std::vector<std::string> argv;  // argv[0]: program (PATH is searched when it has no '/')
  std::string rdzv_dir;           // empty: a new directory under $TMPDIR, removed at the end (given: kept)
  double grace_s = 30;            // after a rank failed: SIGTERM to the others, SIGKILL after this
};

// Returns 0 if every rank exited 0; else the first failing rank's exit code (128 + signal if killed).
int launch(const LaunchOptions& o);

}  // namespace lt::dist
