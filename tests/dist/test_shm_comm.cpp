// ShmCommunicator specifics: data larger than a slot, and bounded waits (a dead, a failing and a hung
// peer end the collective with an error naming the rank and the collective). The collectives
// themselves are checked with the thread communicator's tests (test_comm.cpp, Dist/Worlds.*processes*).
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "core/error.h"
#include "core/timer.h"
#include "dist/shm_comm.h"
#include "process_ranks.h"

namespace lt::dist {
namespace {

using testing::run_rank_processes;
using testing::test_comm_options;

// Runs f, expects an lt::Error whose message contains every needle, and returns how long it took.
template <typename F>
double expect_error(F&& f, const std::vector<std::string>& needles) {
  const double t0 = now_seconds();
  try {
    f();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
  return now_seconds() - t0;
}

TEST(ShmComm, BuffersLargerThanASlotGoInRounds) {
  // 64-byte slots: 16 floats per round; uneven ranges of 1000 floats, an empty one; broadcast of 1001.
  const auto r = run_rank_processes(
      3,
      [](Communicator& c) {
        const int64_t n = 1000;
        const std::vector<int64_t> b = {0, 123, 123, n};
        std::vector<float> g(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) g[size_t(i)] = float(i % 97) * float(c.rank() + 1) + 0.25f;
        c.reduce_scatter(g.data(), b, CommType::F32);
        for (int64_t i = b[size_t(c.rank())]; i < b[size_t(c.rank()) + 1]; ++i) {
          const float x = float(i % 97);
          ASSERT_EQ(g[size_t(i)], ((x * 1 + 0.25f) + (x * 2 + 0.25f)) + (x * 3 + 0.25f)) << i;
        }
        c.all_gather(g.data(), b, CommType::F32);
        for (int64_t i = 0; i < n; ++i) {
          const float x = float(i % 97);
          ASSERT_EQ(g[size_t(i)], ((x * 1 + 0.25f) + (x * 2 + 0.25f)) + (x * 3 + 0.25f)) << i;
        }
        std::vector<int64_t> v(1001, c.rank() == 1 ? 7 : 0);
        c.broadcast(v.data(), int64_t(v.size()), CommType::I64, 1);
        for (int64_t x : v) ASSERT_EQ(x, 7);
        std::vector<double> s(77, double(c.rank()));
        c.all_reduce(s.data(), int64_t(s.size()), CommType::F64);
        for (double x : s) ASSERT_EQ(x, 3.0);
      },
      test_comm_options(10, 64));
  for (int q = 0; q < 3; ++q) EXPECT_EQ(r.codes[size_t(q)], 0) << "rank " << q;
}

TEST(ShmComm, DeadPeerEndsTheCollectiveWithAnErrorNamingIt) {
  const auto r = run_rank_processes(3, [](Communicator& c) {
    if (c.rank() == 2) ::_exit(7);  // dies without a word
    const double s = expect_error([&] { c.barrier(); }, {"rank(s) 2 exited", "barrier"});
    EXPECT_LT(s, 3.0);  // the timeout is 10 s: found by the liveness check, not the timeout
  });
  EXPECT_EQ(r.codes, (std::vector<int>{0, 0, 7}));
  EXPECT_LT(r.seconds, 5.0);
}

TEST(ShmComm, FailingPeerStopsTheOthersAtOnceWithItsMessage) {
  const auto r = run_rank_processes(3, [](Communicator& c) {
    if (c.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      fail("rank 1 broke");  // recorded for the peers by ShmCommunicator::abort (process_ranks.h)
    }
    const double s = expect_error([&] {
      float x = 1;
      c.all_reduce(&x, 1, CommType::F32);
    }, {"rank 1 failed", "rank 1 broke", "all_reduce"});
    EXPECT_LT(s, 3.0);
  });
  EXPECT_EQ(r.codes, (std::vector<int>{0, 3, 0}));
}

// A rank that fails just after a barrier completed: the peer still waking from that barrier returns from it (it
// passed) and meets the failure at its next collective, naming the failed rank there.
TEST(ShmComm, FailureAfterACompletedBarrierIsTheNextCollectivesNews) {
  const auto r = run_rank_processes(2, [](Communicator& c) {
    if (c.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 waits in the barrier by now
      c.barrier();
      fail("rank 1 broke after the barrier");
    }
    EXPECT_NO_THROW(c.barrier());
    expect_error([&] {
      float x = 1;
      c.all_reduce(&x, 1, CommType::F32);
    }, {"rank 1 failed", "rank 1 broke after the barrier", "all_reduce"});
  });
  EXPECT_EQ(r.codes, (std::vector<int>{0, 3}));
}

TEST(ShmComm, HungPeerTimesOutNamingTheRankAndTheCollective) {
  const auto r = run_rank_processes(
      2,
      [](Communicator& c) {
        if (c.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(30));  // hangs; killed at the deadline
          ::_exit(0);
        }
        std::vector<int64_t> b = {0, 4, 8};
        float x[8] = {};
        const double s = expect_error([&] { c.all_gather(x, b, CommType::F32); },
                                      {"rank(s) 1 did not arrive within 1 s", "all_gather", "LT_COMM_TIMEOUT_S"});
        EXPECT_GE(s, 0.9);
        EXPECT_LT(s, 4.0);
      },
      test_comm_options(1.0), /*deadline_s=*/6);
  EXPECT_EQ(r.codes[0], 0);
  EXPECT_EQ(r.codes[1], -1);  // still sleeping at the deadline
}

// A phase where one rank works alone (rank 0 writing a checkpoint) raises the others' timeout.
TEST(ShmComm, ScopedTimeoutLetsARankWorkAloneLongerThanTheTimeout) {
  const auto r = run_rank_processes(
      2,
      [](Communicator& c) {
        EXPECT_EQ(c.timeout_s(), 0.5);
        {
          ScopedCommTimeout longer(c, 10);
          EXPECT_EQ(c.timeout_s(), 10);
          if (c.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          c.barrier();  // rank 1 waits 1.5 s > 0.5 s: no error
        }
        EXPECT_EQ(c.timeout_s(), 0.5);
        ScopedCommTimeout shorter(c, 0.1);  // never lowers it
        EXPECT_EQ(c.timeout_s(), 0.5);
      },
      test_comm_options(0.5));
  EXPECT_EQ(r.codes, (std::vector<int>{0, 0}));
}

// Once every rank joined, the segment and its rendezvous entry are gone (mapped only): a crash later
// leaves nothing in /dev/shm or the rendezvous directory.
TEST(ShmComm, LeavesNothingBehindOnceAllRanksJoined) {
  const std::string key = "leftover-check-" + std::to_string(::getpid());
  ShmCommOptions o = test_comm_options();
  o.key = key;
  const auto r = run_rank_processes(
      3,
      [&](Communicator& c) {
        c.barrier();  // rank 0 removed both before its first collective
        for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
          EXPECT_EQ(e.path().filename().string().find(key), std::string::npos) << e.path();
        EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(std::getenv("LT_RDZV_DIR")) / key));
        c.barrier();  // still works
      },
      o);
  EXPECT_EQ(r.codes, (std::vector<int>{0, 0, 0}));
}

TEST(ShmComm, RendezvousTimesOutWithoutRankZero) {
  std::string dir = (std::filesystem::temp_directory_path() / "lt-shm-test-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  DistEnv env;
  env.rank = 1;
  env.world = 2;
  env.rdzv_dir = dir;
  env.launched = true;
  expect_error([&] { ShmCommunicator::create(env, test_comm_options(0.3)); }, {"did not appear within", "rank 0"});
  std::filesystem::remove_all(dir);
}

TEST(ShmComm, TimeoutFromTheEnvironment) {
  ::unsetenv("LT_COMM_TIMEOUT_S");
  EXPECT_EQ(comm_timeout_from_environment(), 300);
  ::setenv("LT_COMM_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(comm_timeout_from_environment(), 2.5);
  ::setenv("LT_COMM_TIMEOUT_S", "soon", 1);
  expect_error([] { comm_timeout_from_environment(); }, {"LT_COMM_TIMEOUT_S", "soon"});
  ::unsetenv("LT_COMM_TIMEOUT_S");
}

}  // namespace
}  // namespace lt::dist
