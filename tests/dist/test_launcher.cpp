// The process launcher (lazytrain launch) and the file rendezvous.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <thread>

#include "core/error.h"
#include "core/timer.h"
#include "dist/communicator.h"
#include "dist/launcher.h"
#include "dist/rendezvous.h"

namespace lt::dist {
namespace {
namespace fs = std::filesystem;

fs::path tmp(const std::string& n) {
  auto d = fs::temp_directory_path() / ("lt-dist-" + n + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(Launcher, StartsOneProcessPerRankWithItsEnvironment) {
  const fs::path out = tmp("launch");
  LaunchOptions o;
  o.n = 3;
  o.argv = {"/bin/sh", "-c",
            "echo $LT_RANK $LT_LOCAL_RANK $LT_WORLD_SIZE $LT_LOCAL_WORLD_SIZE > " + out.string() +
                "/rank$LT_RANK; test -d \"$LT_RDZV_DIR\" && echo ok >> " + out.string() + "/rank$LT_RANK"};
  EXPECT_EQ(launch(o), 0);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(slurp(out / ("rank" + std::to_string(r))), fmt::format("{} {} 3 3\nok\n", r, r)) << r;
  fs::remove_all(out);
}

TEST(Launcher, AFailingRankStopsTheOthersAndItsCodeIsReturned) {
  LaunchOptions o;
  o.n = 3;
  o.grace_s = 30;
  // Rank 1 fails at once; the others would sleep for a minute and must die of the SIGTERM (not of the
  // SIGKILL after the grace period).
  o.argv = {"/bin/sh", "-c", "if [ $LT_RANK = 1 ]; then exit 7; fi; exec sleep 60"};
  for (int i = 0; i < 3; ++i) {
    const double t0 = now_seconds();
    EXPECT_EQ(launch(o), 7);
    EXPECT_LT(now_seconds() - t0, 5.0);
  }
  o.argv = {"/nonexistent/program"};
  EXPECT_EQ(launch(o), 127);
  o.argv.clear();
  EXPECT_THROW(launch(o), Error);
}

TEST(Launcher, ForwardsSigtermToTheRanks) {
  LaunchOptions o;
  o.n = 2;
  o.argv = {"/bin/sh", "-c", "exec sleep 60"};
  std::thread killer([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(::getpid(), SIGTERM);  // the launcher's handler is installed while launch() runs
  });
  const double t0 = now_seconds();
  EXPECT_EQ(launch(o), 128 + SIGTERM);
  EXPECT_LT(now_seconds() - t0, 5.0);
  killer.join();
}

TEST(Rendezvous, WaitersSeeTheWholeBlob) {
  const fs::path d = tmp("rdzv");
  std::string blob(128, '\0');
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = char(i * 7);
  std::thread pub([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    rdzv_publish(d, "nccl-id", blob);
  });
  EXPECT_EQ(rdzv_wait(d, "nccl-id", 10), blob);
  pub.join();
  EXPECT_THROW(rdzv_wait(d, "missing", 0.05), Error);
  fs::remove_all(d);
}

TEST(DistEnv, ReadsAndValidatesTheLauncherVariables) {
  ::unsetenv("LT_WORLD_SIZE");
  ::unsetenv("LT_RANK");
  ::unsetenv("LT_LOCAL_RANK");
  ::unsetenv("LT_RDZV_DIR");
  auto e = dist_env_from_environment();
  EXPECT_FALSE(e.launched);
  EXPECT_EQ(e.world, 1);
  ::setenv("LT_WORLD_SIZE", "4", 1);
  ::setenv("LT_RANK", "2", 1);
  EXPECT_THROW(dist_env_from_environment(), Error);  // no rendezvous directory
  ::setenv("LT_RDZV_DIR", "/tmp/x", 1);
  e = dist_env_from_environment();
  EXPECT_TRUE(e.launched);
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.local_rank, 2);
  ::setenv("LT_RANK", "4", 1);
  EXPECT_THROW(dist_env_from_environment(), Error);
  ::setenv("LT_RANK", "two", 1);
  EXPECT_THROW(dist_env_from_environment(), Error);
  for (const char* v : {"LT_WORLD_SIZE", "LT_RANK", "LT_RDZV_DIR"}) ::unsetenv(v);
}

}  // namespace
}  // namespace lt::dist
