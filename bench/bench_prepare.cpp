// Data-set tokenisation, one thread vs every core: prepare_data (read, split, render + encode every
// record) on a data set, timed with TokenizeOptions::threads = 1 and = 0 (all cores); the two results
// must be identical.
// Usage: bench_prepare TOKENIZER DATASET [TEMPLATE=auto] [CUTOFF_LEN=1024]
//   e.g. lazytrain data math --n 20000 --out m.jsonl && bench_prepare configs/demo m.jsonl
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

#include "data/prepare.h"

using namespace lt::data;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER DATASET [TEMPLATE=auto] [CUTOFF_LEN=1024]\n", argv[0]);
    return 2;
  }
  const LoadedTokenizer tok = load_tokenizer(argv[1]);
  DataConfig cfg;
  cfg.dataset = argv[2];
  cfg.template_name = argc > 3 ? argv[3] : "auto";
  cfg.cutoff_len = argc > 4 ? std::stoll(argv[4]) : 1024;
  double secs[2];
  std::optional<PreparedData> d[2];
  const int threads[2] = {1, 0};
  for (int k = 0; k < 2; ++k) {
    cfg.threads = threads[k];
    const auto t0 = std::chrono::steady_clock::now();
    d[k].emplace(prepare_data(cfg, tok));
    secs[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  bool same = d[0]->train.size() == d[1]->train.size();
  for (size_t i = 0; same && i < d[0]->train.size(); ++i)
    same = d[0]->train[i].ids == d[1]->train[i].ids && d[0]->train[i].labels == d[1]->train[i].labels;
  std::printf("%s: %zu samples, %lld tokens, template %s\n", cfg.dataset.c_str(), d[0]->train.size(),
              static_cast<long long>(d[0]->train_stats.tokens), template_name(d[0]->tmpl.kind()));
  std::printf("  1 thread:  %.2f s (%.0f records/s)\n", secs[0], d[0]->train.size() / secs[0]);
  std::printf("  %u threads: %.2f s (%.0f records/s), x%.2f; results %s\n", std::thread::hardware_concurrency(), secs[1],
              d[1]->train.size() / secs[1], secs[0] / secs[1], same ? "identical" : "DIFFER");
  return same ? 0 : 1;
}
