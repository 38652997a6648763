// Data-set tokenisation runs on every core (TokenizeOptions::threads): the samples, their order, the
// stats and the error for a bad record are those of one thread.
#include <gtest/gtest.h>

#include "../common/repo_path.h"

#include "core/error.h"
#include "data/chat_template.h"
#include "data/samples.h"
#include "data/synth_math.h"

using namespace lt::data;

namespace {

const std::string kDemo = lt::testing::repo_root().string() + "/configs/demo";

void expect_same(const std::vector<Sample>& a, const std::vector<Sample>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].ids, b[i].ids) << what << " sample " << i;
    ASSERT_EQ(a[i].labels, b[i].labels) << what << " sample " << i;
  }
}

void expect_same(const TokenizeStats& a, const TokenizeStats& b) {
  EXPECT_EQ(a.samples, b.samples);
  EXPECT_EQ(a.truncated, b.truncated);
  EXPECT_EQ(a.skipped_long, b.skipped_long);
  EXPECT_EQ(a.skipped_no_loss, b.skipped_no_loss);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.loss_tokens, b.loss_tokens);
}

TEST(ParallelTokenize, SameSamplesAsOneThread) {
  const LoadedTokenizer lt = load_tokenizer(kDemo);
  std::vector<Record> recs = builtin_math_records("builtin:math", 3000, 5);
  // Text records, and records the cutoff policy truncates or drops, spread through the set.
  for (size_t i = 0; i < recs.size(); i += 97) {
    recs[i].is_text = true;
    recs[i].text = "plain text " + std::to_string(i);
  }
  for (size_t i = 50; i < recs.size(); i += 301) recs[i].messages.back().content = std::string(200, '7');
  for (const char* tmpl : {"auto", "chatml"}) {  // the demo's own Jinja template, and the fallback
    const ChatTemplate t = ChatTemplate::resolve(tmpl, lt.tokenizer, lt.config);
    for (auto overlong : {Overlong::Truncate, Overlong::Skip}) {
      TokenizeOptions o;
      o.cutoff_len = 60;
      o.overlong = overlong;
      o.threads = 1;
      TokenizeStats s1;
      const auto one = tokenize_records(recs, t, o, &s1);
      EXPECT_GT(s1.truncated + s1.skipped_long, 0);
      for (int threads : {2, 3, 8, 0}) {
        o.threads = threads;
        TokenizeStats sn;
        expect_same(one, tokenize_records(recs, t, o, &sn), std::string(tmpl) + " threads " + std::to_string(threads));
        expect_same(s1, sn);
      }
    }
  }
}

// Several bad records: every thread count reports the first one, as a single thread does.
TEST(ParallelTokenize, ErrorIsTheFirstBadRecord) {
  const LoadedTokenizer lt = load_tokenizer(kDemo);
  const ChatTemplate t = ChatTemplate::resolve("chatml", lt.tokenizer, lt.config);
  std::vector<Record> recs = builtin_math_records("builtin:math", 2000, 3);
  for (size_t i : {1900u, 700u, 1300u}) recs[i].messages[0].role = "role" + std::to_string(i);
  for (int threads : {1, 2, 4, 16}) {
    TokenizeOptions o;
    o.threads = threads;
    try {
      tokenize_records(recs, t, o);
      FAIL() << "expected an error";
    } catch (const lt::Error& e) {
      EXPECT_NE(std::string(e.what()).find("'role700'"), std::string::npos) << threads << ": " << e.what();
    }
  }
}

}  // namespace
