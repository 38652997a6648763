// Data preparation polls its stop check (a SIGINT/SIGTERM before training): reading a JSONL file and tokenising
// records end with StopRequested saying where, on one thread or several.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include "../common/repo_path.h"
#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/samples.h"
#include "data/synth_math.h"

using namespace lt::data;
namespace fs = std::filesystem;

TEST(DataStop, ReadingAndTokenisingHonourTheStopCheck) {
  const fs::path file = fs::temp_directory_path() / ("lt_data_stop_" + std::to_string(::getpid()) + ".jsonl");
  {
    std::ofstream f(file);
    for (int i = 0; i < 3 * int(kStopCheckLines); ++i) f << "{\"query\": \"q" << i << "\", \"response\": \"r\"}\n";
  }
  std::atomic<int> polls{0};
  ReadOptions ro;
  ro.stop_requested = [&] { return ++polls >= 2; };  // the second poll asks to stop
  try {
    read_jsonl(file.string(), ro);
    ADD_FAILURE() << "read the whole file";
  } catch (const StopRequested& e) {
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("line " + std::to_string(2 * kStopCheckLines)), std::string::npos) << e.what();
  }
  ro.stop_requested = [] { return false; };
  EXPECT_EQ(read_jsonl(file.string(), ro).size(), size_t(3 * kStopCheckLines));
  fs::remove(file);

  const LoadedTokenizer tok = load_tokenizer(lt::testing::repo_root().string() + "/configs/demo");
  const ChatTemplate t = ChatTemplate::resolve("chatml", tok.tokenizer, tok.config);
  const std::vector<Record> recs = builtin_math_records("builtin:math", 2000, 5);
  for (int threads : {1, 3}) {
    TokenizeOptions o;
    o.threads = threads;
    polls = 0;
    o.stop_requested = [&] { return ++polls >= 3; };
    EXPECT_THROW(tokenize_records(recs, t, o), StopRequested) << threads << " threads";
    o.stop_requested = [] { return false; };
    EXPECT_EQ(tokenize_records(recs, t, o).size(), recs.size()) << threads << " threads";
  }
}
