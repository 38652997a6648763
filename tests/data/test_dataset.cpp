#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <unistd.h>

#include "core/error.h"
#include "data/dataset.h"

using namespace lt::data;
namespace fs = std::filesystem;

namespace {

std::string write_tmp(const std::string& name, const std::string& content) {
  const fs::path p = fs::temp_directory_path() / ("lt_data_test_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << content;
  return p.string();
}

TEST(Dataset, ParsesAllFormats) {
  const std::string path = write_tmp("formats.jsonl",
      R"({"query": "What is 1 + 1?", "response": "2. The answer is: 2"})" "\n"
      "\n"
      R"({"instruction": "Add", "input": "1 and 2", "output": "3", "system": "calc"})" "\n"
      R"({"instruction": "Say hi", "input": "", "output": "hi"})" "\n"
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]})" "\n"
      R"({"text": "some pretraining text"})" "\n");
  ReadStats st;
  const auto r = read_jsonl(path, {}, &st);
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(st.lines, 5);
  EXPECT_EQ(st.malformed, 0);
  EXPECT_EQ(r[0].messages[0].content, "What is 1 + 1?");
  EXPECT_EQ(r[0].reference(), "2. The answer is: 2");
  EXPECT_EQ(r[1].line, 3);
  ASSERT_EQ(r[1].messages.size(), 3u);
  EXPECT_EQ(r[1].messages[0].role, "system");
  EXPECT_EQ(r[1].messages[1].content, "Add\n\n1 and 2");
  EXPECT_EQ(r[2].messages[0].content, "Say hi");
  EXPECT_EQ(r[3].messages.size(), 4u);
  EXPECT_EQ(r[3].prompt_messages().size(), 3u);
  EXPECT_TRUE(r[4].is_text);
  EXPECT_EQ(r[4].text, "some pretraining text");
  fs::remove(path);
}

TEST(Dataset, MalformedRecordsCountedWithLineNumbers) {
  const std::string path = write_tmp("bad.jsonl",
      R"({"query": "q1", "response": "r1"})" "\n"
      R"({"query": "q2"})" "\n"                       // line 2: missing response
      R"({"query": "q3", "response": 5})" "\n"        // line 3: wrong type
      "{not json\n"                                  // line 4
      R"({"foo": 1})" "\n"                            // line 5: unknown format
      R"({"messages": [{"role": "robot", "content": "x"}]})" "\n"  // line 6: bad role
      R"({"query": "q7", "response": "r7"})" "\n");
  ReadOptions opt;
  opt.max_reported = 3;
  ReadStats st;
  const auto r = read_jsonl(path, opt, &st);
  EXPECT_EQ(r.size(), 2u);
  EXPECT_EQ(st.malformed, 5);
  ASSERT_EQ(st.first_errors.size(), 3u);
  EXPECT_NE(st.first_errors[0].find(":2: missing field 'response'"), std::string::npos) << st.first_errors[0];
  EXPECT_NE(st.first_errors[1].find(":3: field 'response': expected a string"), std::string::npos) << st.first_errors[1];
  EXPECT_NE(st.first_errors[2].find(":4: invalid JSON"), std::string::npos) << st.first_errors[2];
  opt.malformed_fatal = true;
  try {
    read_jsonl(path, opt);
    FAIL();
  } catch (const lt::Error& e) {
    EXPECT_NE(std::string(e.what()).find(":2: missing field 'response'"), std::string::npos) << e.what();
  }
  // Forcing a format that does not match.
  opt.malformed_fatal = false;
  opt.format = RecordFormat::Alpaca;
  EXPECT_THROW(read_jsonl(path, opt), lt::Error);  // no valid record at all
  fs::remove(path);
}

TEST(Dataset, WriteReadRoundTripAndMaxSamples) {
  std::vector<Record> recs(3);
  recs[0].messages = {{"user", "q"}, {"assistant", "a"}};
  recs[1].messages = {{"system", "s"}, {"user", "q"}, {"assistant", "a"}};
  recs[2].is_text = true;
  recs[2].text = "t\n\"x\"";
  const std::string path = write_tmp("rt.jsonl", "");
  write_jsonl(path, recs);
  const auto back = read_jsonl(path, {});
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[1].messages.size(), 3u);
  EXPECT_EQ(back[2].text, recs[2].text);
  ReadOptions o;
  o.max_samples = 2;
  EXPECT_EQ(read_jsonl(path, o).size(), 2u);
  fs::remove(path);
}

TEST(Dataset, TrainValSplitIsDeterministicAndDisjoint) {
  std::vector<Record> all(100);
  for (int i = 0; i < 100; ++i) all[i].text = std::to_string(i), all[i].is_text = true;
  std::vector<Record> tr, va, tr2, va2;
  split_train_val(all, 0.1, 7, tr, va);
  split_train_val(all, 0.1, 7, tr2, va2);
  ASSERT_EQ(va.size(), 10u);
  ASSERT_EQ(tr.size(), 90u);
  std::set<std::string> seen;
  for (auto& r : tr) seen.insert(r.text);
  for (auto& r : va) EXPECT_EQ(seen.count(r.text), 0u);
  for (size_t i = 0; i < va.size(); ++i) EXPECT_EQ(va[i].text, va2[i].text);
  split_train_val(all, 25, 7, tr, va);
  EXPECT_EQ(va.size(), 25u);
  split_train_val(all, 0.1, 8, tr2, va2);
  bool differs = false;
  for (size_t i = 0; i < va2.size(); ++i) differs |= va2[i].text != va[i].text;
  EXPECT_TRUE(differs);
  split_train_val(all, 0, 7, tr, va);
  EXPECT_EQ(va.size(), 0u);
  EXPECT_THROW(split_train_val(all, 100, 7, tr, va), lt::Error);
}

TEST(Dataset, UnknownBuiltinAndFormatNames) {
  EXPECT_THROW(load_records("builtin:poetry", {}), lt::Error);
  EXPECT_THROW(parse_record_format("csv"), lt::Error);
  EXPECT_THROW(read_jsonl("/nonexistent.jsonl", {}), lt::Error);
}

}  // namespace
