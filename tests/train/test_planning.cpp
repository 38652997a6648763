// The training plan's NVMe queue (train/planning.h, nvme_queue_shape): the rule at the profile's faster NVMe rate and
// its latency (or the default), and the profile's overrides. The data's attention fraction (attention_fraction,
// sampled_attention_fraction) by hand.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../common/repo_path.h"
#include "core/error.h"
#include "data/batch.h"
#include "nvme/io_queue.h"
#include "plan/profile.h"
#include "train/planning.h"

using namespace lt;

namespace {

TEST(Planning, NvmeQueueFromTheProfile) {
  ResourceProfile p = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/rtx3090-24g.json");
  // 3.5 GB/s read (faster than the 3.0 GB/s write), the default 100 us: 4 x 2 MiB (nvme/io_queue.h by hand).
  IoQueueShape s = train::nvme_queue_shape(p);
  EXPECT_EQ(s.depth, 4u);
  EXPECT_EQ(s.piece, 2 << 20);
  // A slow network disk: 5 ms at 2 GB/s: 11 x 1 MiB.
  p.nvme_read_bw = 2e9;
  p.nvme_write_bw = 1e9;
  p.nvme_latency_s = 5e-3;
  s = train::nvme_queue_shape(p);
  EXPECT_EQ(s.depth, 11u);
  EXPECT_EQ(s.piece, 1 << 20);
  // The profile's overrides.
  p.nvme_queue_depth = 32;
  p.nvme_request_bytes = 128 << 10;
  s = train::nvme_queue_shape(p);
  EXPECT_EQ(s.depth, 32u);
  EXPECT_EQ(s.piece, 128 << 10);
}

// `lazytrain profile`'s NVMe measurement (plan/profile.h measure_nvme) on a small file in the temp directory: a
// positive, finite latency that round-trips through the profile JSON as nvme_latency_us and sets the queue rule's
// latency; a profile without the field (written before it was measured) loads with 0, and the rule's default applies.
TEST(Planning, MeasuredNvmeLatencyInTheProfile) {
  const auto dir = std::filesystem::temp_directory_path() / ("lt-latency-test-" + std::to_string(::getpid()));
  const NvmeBandwidth nv = measure_nvme(dir, 8 << 20);
  std::filesystem::remove_all(dir);
  EXPECT_GT(nv.latency_s, 0);
  EXPECT_TRUE(std::isfinite(nv.latency_s));
  ResourceProfile p = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/rtx3090-24g.json");
  p.nvme_read_bw = nv.read_bw;
  p.nvme_write_bw = nv.write_bw;
  p.nvme_latency_s = nv.latency_s;
  nlohmann::json j = profile_to_json(p);
  ASSERT_TRUE(j.contains("nvme_latency_us"));
  const ResourceProfile back = profile_from_json(j, "measured");
  EXPECT_NEAR(back.nvme_latency_s, nv.latency_s, 1e-12);
  const double bw = std::max(nv.read_bw, nv.write_bw);
  EXPECT_EQ(train::nvme_queue_shape(back).depth, io_queue_shape(bw, nv.latency_s).depth);
  EXPECT_EQ(train::nvme_queue_shape(back).piece, io_queue_shape(bw, nv.latency_s).piece);
  j.erase("nvme_latency_us");
  const ResourceProfile old = profile_from_json(j, "old");
  EXPECT_EQ(old.nvme_latency_s, 0);
  EXPECT_EQ(train::nvme_queue_shape(old).depth, io_queue_shape(bw, kDefaultIoLatency).depth);
  EXPECT_EQ(train::nvme_queue_shape(old).piece, io_queue_shape(bw, kDefaultIoLatency).piece);
}

// Rows of `seq` tokens with the given segment ids, one micro-batch.
data::Batch batch_of(int64_t seq, const std::vector<std::vector<int32_t>>& rows) {
  data::Batch b;
  b.batch = int64_t(rows.size());
  b.seq = seq;
  for (const auto& r : rows) b.segments.insert(b.segments.end(), r.begin(), r.end());
  return b;
}

// The start-up profile's NVMe rates: measured under nvme_dir where it has room (the file removed afterwards), else
// left as they were, a failed measurement included.
TEST(Planning, MeasuresTheNvmeRatesWhereItCan) {
  const auto dir = std::filesystem::temp_directory_path() / ("lt_measure_nvme_" + std::to_string(::getpid()));
  ResourceProfile p;
  p.nvme_read_bw = p.nvme_write_bw = 1e9;
  EXPECT_FALSE(train::measure_profile_nvme(p));  // no nvme_dir
  p.nvme_dir = dir.string();
  p.nvme_bytes = int64_t(256) << 20;  // room for less than twice the file
  EXPECT_FALSE(train::measure_profile_nvme(p));
  EXPECT_EQ(p.nvme_read_bw, 1e9);
  p.nvme_bytes = int64_t(8) << 30;
  ASSERT_TRUE(train::measure_profile_nvme(p));
  EXPECT_GT(p.nvme_read_bw, 0);
  EXPECT_NE(p.nvme_read_bw, 1e9);
  EXPECT_GT(p.nvme_write_bw, 0);
  EXPECT_GT(p.nvme_latency_s, 0);
  EXPECT_TRUE(std::filesystem::is_empty(dir));  // the measurement's file is gone
  std::filesystem::remove_all(dir);
  ResourceProfile q;
  q.nvme_read_bw = q.nvme_write_bw = 1e9;
  q.nvme_dir = "/proc/lt-no-such-dir";  // cannot be created: a warning, the rates kept
  q.nvme_bytes = int64_t(8) << 30;
  EXPECT_FALSE(train::measure_profile_nvme(q));
  EXPECT_EQ(q.nvme_read_bw, 1e9);
  EXPECT_EQ(q.nvme_write_bw, 1e9);
}

TEST(Planning, AttentionFractionOfPackedRowsByHand) {
  // Row 0: segments of 3, 2 and 3 tokens (9 + 4 + 9 = 22 of 64); row 1: one segment of 8 (64 of 64).
  const auto b = batch_of(8, {{0, 0, 0, 1, 1, 2, 2, 2}, {0, 0, 0, 0, 0, 0, 0, 0}});
  EXPECT_DOUBLE_EQ(train::attention_fraction({b}, true), 86.0 / 128.0);
  EXPECT_DOUBLE_EQ(train::attention_fraction({b}, false), 1.0);  // unpacked rows: one segment each
  // Two micro-batches: the rows of both.
  const auto one = batch_of(8, {{0, 0, 0, 0, 1, 1, 1, 1}});  // 16 + 16 = 32 of 64
  EXPECT_DOUBLE_EQ(train::attention_fraction({b, one}, true), (86.0 + 32.0) / 192.0);
  EXPECT_THROW(train::attention_fraction({}, true), Error);
}

data::Sample sample_of(int n) {
  data::Sample s;
  s.ids.assign(size_t(n), 5);
  s.labels.assign(size_t(n), 5);
  return s;
}

TEST(Planning, SampledAttentionFractionPacksAsTheLoader) {
  // Samples of 3, 2 and 3 tokens pack into one row of 8 in any order: 22 / 64; the next rows take the next epoch's.
  const std::vector<data::Sample> samples = {sample_of(3), sample_of(2), sample_of(3)};
  data::LoaderOptions lo;
  lo.batch = 1;
  lo.seq = 8;
  lo.packing = true;
  EXPECT_DOUBLE_EQ(train::sampled_attention_fraction(samples, lo, 1), 22.0 / 64.0);
  EXPECT_DOUBLE_EQ(train::sampled_attention_fraction(samples, lo, 4), 22.0 / 64.0);
  // Rows of 4: 3 | 2 | 3 | 3 ... one sample each (a row is closed with its padding as one more segment).
  lo.seq = 4;
  lo.shuffle = false;
  // 3 + padding 1: 9 + 1 = 10; 2 + padding 2: 4 + 4 = 8; 3 + 1: 10 -> 28 / 48.
  EXPECT_DOUBLE_EQ(train::sampled_attention_fraction(samples, lo, 3), 28.0 / 48.0);
  lo.packing = false;
  EXPECT_DOUBLE_EQ(train::sampled_attention_fraction(samples, lo, 3), 1.0);
}

}  // namespace
