// Single-thread encode throughput of one tokenizer on a text file (one document per line), for the
// comparison with HF tokenizers in bench/tokenizer_vs_hf.py (which runs both and prints both).
// Usage: bench_tokenize_file TOKENIZER_DIR_OR_JSON CORPUS.txt   -> "lazytrain: N bytes, T tokens, S s, X MB/s"
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "data/chat_template.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER CORPUS\n", argv[0]);
    return 2;
  }
  const auto lt = lt::data::load_tokenizer(argv[1]);
  std::ifstream f(argv[2]);
  std::vector<std::string> lines;
  size_t bytes = 0;
  for (std::string l; std::getline(f, l);) {
    bytes += l.size();
    lines.push_back(std::move(l));
  }
  const auto t0 = std::chrono::steady_clock::now();
  size_t toks = 0;
  for (const auto& l : lines) toks += lt.tokenizer.encode(l).size();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("lazytrain: %zu bytes, %zu tokens, %.2f s, %.2f MB/s\n", bytes, toks, s, bytes / s / 1e6);
  return 0;
}
