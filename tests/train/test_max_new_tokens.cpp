// The generation limit max_new_tokens is user input (`--max-new-tokens` of generate and eval, the
// config key max_new_tokens of the final evaluation). The KV cache of a sequence is sized for
// prompt + max_new_tokens rows: a negative count sized it below the prompt (heap corruption at -1,
// std::length_error at -100). The entry points take >= 1; greedy_generate refuses a negative count and
// a prompt + count past max_position without overflowing.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "core/error.h"
#include "infer/generate.h"
#include "model/init.h"
#include "train/config.h"

using namespace lt;
using namespace lt::train;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TrainConfig config_with(const std::string& max_new_tokens) {
  return parse_config("model_name_or_path: tiny-qwen2\nmax_steps: 1\nmax_new_tokens: " + max_new_tokens + "\n",
                      "run.yaml");
}

}  // namespace

TEST(MaxNewTokens, TrainConfigKeyMustBeAtLeastOne) {
  for (const char* bad : {"-1", "-100", "0"}) {
    const std::string e = error_of([&] { config_with(bad); });
    EXPECT_EQ(e, std::string("config: max_new_tokens must be > 0, got ") + bad);
  }
  EXPECT_EQ(config_with("1").eval.max_new_tokens, 1);
  EXPECT_EQ(config_with("48").eval.max_new_tokens, 48);
  // An override on the command line is checked the same way.
  const std::string e = error_of([] {
    parse_config("model_name_or_path: tiny-qwen2\nmax_steps: 1\n", "run.yaml", {"max_new_tokens=-1"});
  });
  EXPECT_EQ(e, "config: max_new_tokens must be > 0, got -1");
}

TEST(MaxNewTokens, CheckNamesTheOptionAndExpectedValue) {
  EXPECT_EQ(error_of([] { check_max_new_tokens(-1, "--max-new-tokens"); }),
            "--max-new-tokens -1: expected the number of new tokens to generate per sequence, >= 1");
  EXPECT_TRUE(has(error_of([] { check_max_new_tokens(0, "--max-new-tokens"); }), "--max-new-tokens 0: expected"));
  EXPECT_EQ(error_of([] { check_max_new_tokens(1, "--max-new-tokens"); }), "");
  const ModelConfig c = preset_config("tiny-qwen2");
  EXPECT_EQ(error_of([&] { check_fits_max_position(c, 10, c.max_position - 10, "--max-new-tokens"); }), "");
  const std::string past = error_of([&] { check_fits_max_position(c, 10, c.max_position - 9, "--max-new-tokens"); });
  EXPECT_TRUE(has(past, "exceeds the model's max_position_embeddings " + std::to_string(c.max_position))) << past;
  const int64_t huge = std::numeric_limits<int64_t>::max();  // prompt + huge overflowed to a negative capacity
  EXPECT_TRUE(has(error_of([&] { check_fits_max_position(c, 10, huge, "--max-new-tokens"); }), "max_position"));
}

// -1 corrupted the heap (a KV cache of prompt - 1 rows), -100 threw std::length_error; both are
// lt::Error now, before any cache is sized. 0 still prefills and generates nothing (the GPU decoder's
// semantics too).
TEST(MaxNewTokens, GreedyGenerateRefusesNegativeAndOverflowingCounts) {
  const ModelConfig c = preset_config("tiny-qwen2");
  const ModelWeights m = random_model(c, 7);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6, 7, 8}, {9, 10}};
  GenerateOptions opt;
  for (int64_t bad : {int64_t(-1), int64_t(-100), std::numeric_limits<int64_t>::min()}) {
    opt.max_new_tokens = bad;
    const std::string e = error_of([&] { greedy_generate(view_of(m), prompts, opt); });
    EXPECT_EQ(e, "generate: max_new_tokens " + std::to_string(bad) + ": expected >= 0");
  }
  opt.max_new_tokens = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(has(error_of([&] { greedy_generate(view_of(m), prompts, opt); }), "max_position_embeddings"));
  opt.max_new_tokens = 0;
  const auto none = greedy_generate(view_of(m), prompts, opt);
  ASSERT_EQ(none.size(), 2u);
  EXPECT_TRUE(none[0].empty() && none[1].empty());
  opt.max_new_tokens = 3;
  const auto three = greedy_generate(view_of(m), prompts, opt);
  EXPECT_EQ(three[0].size(), 3u);
}
