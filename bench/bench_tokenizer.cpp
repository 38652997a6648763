// Tokenizer throughput: encode/decode MB/s and tokens/s on (a) the builtin math records through the
// demo tokenizer + ChatML, (b) mixed multilingual text through the Qwen2 and Llama-3 fixture tokenizers.
// Usage: bench_tokenizer [repeat=200]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "data/chat_template.h"
#include "data/bpe.h"
#include "data/synth_math.h"
#include "data/rng.h"
#include "data/unicode.h"

using namespace lt::data;
using clk = std::chrono::steady_clock;

static double secs(clk::time_point a) { return std::chrono::duration<double>(clk::now() - a).count(); }

int main(int argc, char** argv) {
  const int repeat = argc > 1 ? std::atoi(argv[1]) : 200;
  #ifndef LT_SOURCE_DIR
#define LT_SOURCE_DIR "."
#endif
  const std::string root = LT_SOURCE_DIR;
  {
    const LoadedTokenizer lt = load_tokenizer(root + "/configs/demo");
    const ChatTemplate t = ChatTemplate::resolve("auto", lt.tokenizer, lt.config);
    const auto recs = builtin_math_records("builtin:math", 20000, 1);
    auto t0 = clk::now();
    size_t tokens = 0;
    for (const auto& r : recs) tokens += t.encode(r.messages).ids.size();
    const double s = secs(t0);
    std::printf("builtin:math 20000 records (demo tokenizer, ChatML): %.3f s, %.0f records/s, %.2f M tokens/s\n", s,
                20000 / s, tokens / s / 1e6);
  }
  {
    // A Qwen-size tokenizer.json (151,643 BPE tokens + 151,387 merges of random pairs, 22 added tokens),
    // built from the Qwen2 fixture's pipeline: load time and encode speed at full vocabulary size.
    std::ifstream f(root + "/tests/fixtures/tokenizer/qwen2_tokenizer.json");
    auto j = nlohmann::json::parse(f);
    nlohmann::json vocab = nlohmann::json::object(), merges = nlohmann::json::array();
    std::vector<std::string> toks;
    for (int b = 0; b < 256; ++b) {
      std::string s;
      utf8_append(s, byte_to_unicode()[b]);
      vocab[s] = int(toks.size());
      toks.push_back(s);
    }
    Rng r(1);
    while (toks.size() < 151643) {
      const std::string& a = toks[r.below(toks.size())];
      const std::string& b = toks[r.below(std::min<size_t>(toks.size(), 4096))];
      std::string ab = a + b;
      if (ab.size() > 24 || vocab.contains(ab)) continue;
      merges.push_back({a, b});
      vocab[ab] = int(toks.size());
      toks.push_back(ab);
    }
    j["model"]["vocab"] = vocab;
    j["model"]["merges"] = merges;
    j["added_tokens"] = nlohmann::json::array();
    for (int i = 0; i < 22; ++i)
      j["added_tokens"].push_back({{"id", 151643 + i}, {"content", "<|extra_" + std::to_string(i) + "|>"},
                                   {"special", true}, {"normalized", false}});
    const std::string text = j.dump();
    auto t0 = clk::now();
    const Tokenizer big = Tokenizer::from_json(nlohmann::json::parse(text), "big");
    std::printf("Qwen-size tokenizer.json (%.1f MB, %d ids, %zu merges): parse + load %.2f s\n", text.size() / 1e6,
                big.vocab_size(), merges.size(), secs(t0));
    std::string sample;
    for (int i = 0; i < 2000; ++i) sample += "The quick brown fox " + std::to_string(i) + " jumps over the lazy dog.\n";
    t0 = clk::now();
    const auto ids = big.encode(sample);
    std::printf("  encode English %.2f MB: %.2f MB/s, %zu tokens\n", sample.size() / 1e6, sample.size() / secs(t0) / 1e6,
                ids.size());
  }
  for (std::string fam : {"qwen2", "llama3"}) {
    const Tokenizer tok = Tokenizer::from_file(root + "/tests/fixtures/tokenizer/" + fam + "_tokenizer.json");
    std::ifstream f(root + "/tests/fixtures/tokenizer/" + fam + "_cases.json");
    const auto cases = nlohmann::json::parse(f);
    std::string text;
    for (const auto& c : cases["cases"]) text += c["text"].get<std::string>() + "\n";
    std::string big;
    for (int i = 0; i < repeat; ++i) big += text;
    auto t0 = clk::now();
    const auto ids = tok.encode(big);
    const double se = secs(t0);
    t0 = clk::now();
    const std::string back = tok.decode(ids);
    const double sd = secs(t0);
    std::printf("%s mixed text %.2f MB: encode %.2f MB/s (%.2f M tokens/s), decode %.1f MB/s, round trip %s\n",
                fam.c_str(), big.size() / 1e6, big.size() / se / 1e6, ids.size() / se / 1e6, big.size() / sd / 1e6,
                back == tok.normalize(big) ? "exact" : "DIFFERS");
  }
}
