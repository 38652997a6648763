// `lazytrain launch -n N [--program] -- <args>`: one process per GPU of this host (src/dist/launcher.h).
// Without --program the arguments are a lazytrain subcommand run with this same binary, e.g.
//   lazytrain launch -n 8 -- train run.yaml
// (only `train` runs as ranks: data-parallel, docs/distributed.md). With --program they are any
// command, e.g. lazytrain launch -n 8 --program -- build/bench/bench_dist ...
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <set>

#include "cli/commands.h"
#include "core/error.h"
#include "dist/launcher.h"

namespace lt::cli {

namespace {
std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  LT_CHECK(n > 0, "launch: cannot resolve /proc/self/exe");
  return std::string(buf, size_t(n));
}
}  // namespace

void add_launch(CLI::App& app) {
  struct Opts {
    int n = 1;
    bool program = false;
    std::string rdzv_dir;
    double grace = 30;
    double comm_timeout = 0;
    std::vector<std::string> args;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("launch", "Start one process per GPU (data-parallel training over NCCL)");
  sub->add_option("-n,--nproc", o->n, "processes (GPUs) on this host")->required()->check(CLI::Range(1, 1024));
  sub->add_flag("--program", o->program, "the arguments are a program and its arguments, not a lazytrain subcommand");
  sub->add_option("--rdzv-dir", o->rdzv_dir, "rendezvous directory (default: a new temporary directory)");
  sub->add_option("--grace", o->grace, "seconds between SIGTERM and SIGKILL after a rank failed")->capture_default_str();
  sub->add_option("--comm-timeout", o->comm_timeout,
                  "seconds a rank waits in a collective for the others before failing (sets LT_COMM_TIMEOUT_S; "
                  "default 300)");
  sub->add_option("args", o->args, "after --: the subcommand (or program) and its arguments")->required();
  sub->callback([o] {
    dist::LaunchOptions lo;
    lo.n = o->n;
    lo.rdzv_dir = o->rdzv_dir;
    lo.grace_s = o->grace;
    // Only `train` knows about ranks: N copies of another subcommand would each run it whole (into the
    // same output files). Refuse rather than do that silently.
    static const std::set<std::string> rank_aware = {"train"};
    const std::string sub_name = o->args.empty() ? std::string("?") : o->args[0];
    LT_CHECK(o->program || o->n == 1 || rank_aware.count(sub_name),
             "launch: `lazytrain {}` does not run as several ranks: {} processes would each run it whole. Run it "
             "without launch, launch `train` (data parallel), or a rank-aware program with --program (e.g. "
             "build/bench/bench_dist)",
             sub_name, o->n);
    if (o->comm_timeout > 0) ::setenv("LT_COMM_TIMEOUT_S", std::to_string(o->comm_timeout).c_str(), 1);
    if (!o->program) lo.argv.push_back(self_exe());
    lo.argv.insert(lo.argv.end(), o->args.begin(), o->args.end());
    const int rc = dist::launch(lo);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace lt::cli
