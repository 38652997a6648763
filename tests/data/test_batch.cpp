#include "../common/repo_path.h"
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <numeric>

#include "core/error.h"
#include "data/batch.h"
#include "data/synth_math.h"

using namespace lt::data;

namespace {

// Sample i: tokens all equal to 1000 + i, length 3 + (i * 7) % 11, loss on the second half.
std::vector<Sample> make_samples(int n) {
  std::vector<Sample> v;
  for (int i = 0; i < n; ++i) {
    Sample s;
    const int len = 3 + (i * 7) % 11;
    for (int t = 0; t < len; ++t) {
      s.ids.push_back(1000 + i);
      s.labels.push_back(t >= len / 2 ? 1000 + i : kIgnoreLabel);
    }
    v.push_back(s);
  }
  return v;
}

// Targets after the reference's shift: t predicts t+1 within the same segment of the same row.
int64_t count_targets(const Batch& b) {
  int64_t n = 0;
  for (int64_t r = 0; r < b.batch; ++r)
    for (int64_t t = 0; t + 1 < b.seq; ++t) {
      const int64_t i = r * b.seq + t;
      if (b.segments[i] == b.segments[i + 1] && b.labels[i + 1] != kIgnoreLabel) ++n;
    }
  return n;
}

// Checks the geometry of every row and returns the sample ids in stream order.
std::vector<int> check_and_list(const Batch& b, int32_t pad) {
  std::vector<int> order;
  EXPECT_EQ(b.input_ids.size(), size_t(b.batch * b.seq));
  EXPECT_EQ(count_targets(b), b.n_loss_tokens);
  int64_t real = 0;
  for (int64_t r = 0; r < b.batch; ++r) {
    int32_t seg = -1, cur_id = -1;
    for (int64_t t = 0; t < b.seq; ++t) {
      const int64_t i = r * b.seq + t;
      if (t == 0 || b.segments[i] != b.segments[i - 1]) {
        EXPECT_EQ(b.segments[i], seg + 1);  // segments count up from 0
        EXPECT_EQ(b.positions[i], 0);       // positions restart
        seg = b.segments[i];
        cur_id = b.input_ids[i];
        if (cur_id != pad) order.push_back(cur_id - 1000);
      } else {
        EXPECT_EQ(b.positions[i], b.positions[i - 1] + 1);
        EXPECT_EQ(b.input_ids[i], cur_id);  // a segment holds exactly one sample (no cross-contamination)
      }
      if (b.input_ids[i] == pad) EXPECT_EQ(b.labels[i], kIgnoreLabel);
      else ++real;
    }
  }
  EXPECT_EQ(real, b.n_real_tokens);
  return order;
}

TEST(Batch, PackingGeometryAndEpochCoverage) {
  const auto samples = make_samples(37);
  LoaderOptions o;
  o.batch = 3;
  o.seq = 16;
  o.packing = true;
  o.pad_id = 7;
  DataLoader dl(&samples, o);
  std::vector<int> stream;
  int64_t rows = 0;
  while (stream.size() < samples.size()) {
    const Batch b = dl.next();
    const auto ids = check_and_list(b, o.pad_id);
    stream.insert(stream.end(), ids.begin(), ids.end());
    rows += b.batch;
  }
  std::vector<int> first(stream.begin(), stream.begin() + samples.size());
  std::sort(first.begin(), first.end());
  std::vector<int> want(samples.size());
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(first, want);  // each sample exactly once per epoch
  EXPECT_LT(dl.rows_per_epoch(), int64_t(samples.size()));  // packing saves rows
  EXPECT_GE(dl.rows_per_epoch(), int64_t(std::accumulate(samples.begin(), samples.end(), size_t(0),
                                                          [](size_t a, const Sample& s) { return a + s.ids.size(); }) / 16));
}

TEST(Batch, PaddingOneSamplePerRow) {
  const auto samples = make_samples(10);
  LoaderOptions o;
  o.batch = 4;
  o.seq = 14;
  o.packing = false;
  o.shuffle = false;
  DataLoader dl(&samples, o);
  EXPECT_EQ(dl.rows_per_epoch(), 10);
  EXPECT_EQ(dl.batches_per_epoch(), 3);
  const Batch b = dl.next();
  const auto ids = check_and_list(b, 0);
  EXPECT_EQ(ids, (std::vector<int>{0, 1, 2, 3}));  // no shuffle: file order
  EXPECT_EQ(b.n_samples, 4);
  int64_t want_loss = 0;
  for (int i = 0; i < 4; ++i) want_loss += samples[i].n_loss();
  EXPECT_EQ(b.n_loss_tokens, want_loss);
  // Epoch wrap: 10 samples, batches of 4 -> third batch takes 2 from epoch 0, 2 from epoch 1.
  dl.next();
  dl.next();
  EXPECT_EQ(dl.position(), (DataPosition{1, 2}));
  EXPECT_DOUBLE_EQ(dl.epoch_progress(), 1.2);
}

TEST(Batch, ResumeGivesIdenticalBatches) {
  const auto samples = make_samples(23);
  for (bool pack : {false, true}) {
    LoaderOptions o;
    o.batch = 2;
    o.seq = 16;
    o.packing = pack;
    o.seed = 99;
    DataLoader a(&samples, o);
    for (int i = 0; i < 17; ++i) a.next();  // crosses epochs
    const nlohmann::json saved = a.position().to_json();
    std::vector<Batch> want;
    for (int i = 0; i < 9; ++i) want.push_back(a.next());
    DataLoader b(&samples, o);
    b.restore(DataPosition::from_json(nlohmann::json::parse(saved.dump())));
    for (int i = 0; i < 9; ++i) {
      const Batch g = b.next();
      EXPECT_EQ(g.input_ids, want[i].input_ids);
      EXPECT_EQ(g.labels, want[i].labels);
      EXPECT_EQ(g.positions, want[i].positions);
      EXPECT_EQ(g.segments, want[i].segments);
      EXPECT_EQ(g.n_loss_tokens, want[i].n_loss_tokens);
    }
    // A different seed gives a different order.
    o.seed = 100;
    DataLoader c(&samples, o);
    DataLoader d(&samples, LoaderOptions{2, 16, pack, true, 99, 0});
    bool differs = false;
    for (int i = 0; i < 5; ++i) differs |= c.next().input_ids != d.next().input_ids;
    EXPECT_TRUE(differs);
  }
  EXPECT_THROW(DataPosition::from_json(nlohmann::json{{"epoch", 1}}), lt::Error);
  DataLoader e(&samples, {});
  EXPECT_THROW(e.restore({0, 24}), lt::Error);
}

// peek(k) shows the next k batches without advancing (positions included), across epochs; next() then returns
// exactly those, and a restore drops what was peeked.
TEST(Batch, PeekShowsTheNextBatchesWithoutAdvancing) {
  const auto samples = make_samples(23);
  LoaderOptions o;
  o.batch = 2;
  o.seq = 16;
  o.seed = 7;
  DataLoader plain(&samples, o), peeking(&samples, o);
  for (int step = 0; step < 20; ++step) {  // crosses epochs, while batches are peeked ahead
    const std::vector<Batch> ahead = peeking.peek(step % 3 + 1);
    const DataPosition before = peeking.position();
    EXPECT_EQ(before.epoch, plain.position().epoch);
    EXPECT_EQ(before.index, plain.position().index);
    const Batch want = plain.next(), got = peeking.next();
    EXPECT_EQ(ahead[0].input_ids, got.input_ids) << step;
    EXPECT_EQ(got.input_ids, want.input_ids) << step;
    EXPECT_EQ(got.segments, want.segments) << step;
    EXPECT_EQ(peeking.position().index, plain.position().index) << step;
    EXPECT_EQ(peeking.position().epoch, plain.position().epoch) << step;
  }
  const DataPosition at = plain.position();
  peeking.peek(2);
  peeking.restore(at);
  EXPECT_EQ(peeking.next().input_ids, plain.next().input_ids);
}

TEST(Batch, EvalBatchesCoverAllInOrder) {
  const auto samples = make_samples(11);
  for (bool pack : {false, true}) {
    const auto batches = make_batches(samples, 3, 16, pack, 0);
    std::vector<int> seen;
    int64_t loss = 0;
    for (const auto& b : batches) {
      auto ids = check_and_list(b, 0);
      seen.insert(seen.end(), ids.begin(), ids.end());
      loss += b.n_loss_tokens;
    }
    std::vector<int> want(11);
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(seen, want);
    int64_t want_loss = 0;
    for (const auto& s : samples) want_loss += s.n_loss();
    EXPECT_EQ(loss, want_loss);
    if (!pack) {
      EXPECT_EQ(batches.size(), 4u);
    }
  }
}

TEST(Batch, TooLongSampleIsAnError) {
  const auto samples = make_samples(5);
  LoaderOptions o;
  o.seq = 8;
  EXPECT_THROW(DataLoader(&samples, o), lt::Error);
}

// Tokenisation of the builtin data with the fixture tokenizer: cutoff policies.
TEST(Samples, CutoffTruncateOrSkip) {
  const Tokenizer tok = Tokenizer::from_file(lt::testing::repo_root().string() + "/tests/fixtures/tokenizer/qwen2_tokenizer.json");
  const ChatTemplate t(TemplateKind::ChatML, tok);
  const auto recs = builtin_math_records("builtin:math", 200, 1);
  TokenizeOptions o;
  o.cutoff_len = 4096;
  TokenizeStats st;
  const auto full = tokenize_records(recs, t, o, &st);
  ASSERT_EQ(full.size(), 200u);
  size_t maxlen = 0, minlen = 1 << 30;
  for (const auto& s : full) maxlen = std::max(maxlen, s.ids.size()), minlen = std::min(minlen, s.ids.size());
  ASSERT_LT(minlen, maxlen);
  o.cutoff_len = static_cast<int64_t>(maxlen) - 1;
  const auto trunc = tokenize_records(recs, t, o, &st);
  EXPECT_EQ(trunc.size(), 200u);
  EXPECT_GT(st.truncated, 0);
  for (const auto& s : trunc) EXPECT_LE(int64_t(s.ids.size()), o.cutoff_len);
  o.overlong = Overlong::Skip;
  const auto skip = tokenize_records(recs, t, o, &st);
  EXPECT_EQ(int64_t(skip.size()) + st.skipped_long, 200);
  EXPECT_GT(st.skipped_long, 0);
  // A cutoff inside the prompt leaves no loss token: the sample is dropped.
  o.overlong = Overlong::Truncate;
  o.cutoff_len = 4;
  EXPECT_THROW(tokenize_records(recs, t, o, &st), lt::Error);
  EXPECT_EQ(parse_overlong("skip"), Overlong::Skip);
  EXPECT_THROW(parse_overlong("drop"), lt::Error);
}

}  // namespace
