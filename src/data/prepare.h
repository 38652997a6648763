// One call from config values to ready-to-batch samples: load the tokenizer and template, read or
// generate the records, split off validation, tokenise with the cutoff policy. The trainer uses this.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/samples.h"

namespace lt::data {

struct DataConfig {
  std::string dataset;          // JSONL path or builtin:math[?...]
  std::string eval_dataset;     // optional JSONL/builtin for validation; else val_size split
  std::string template_name = "auto";
  std::string format = "auto";  // record format (auto | query_response | alpaca | messages | text)
  std::string on_malformed = "skip";  // skip | fatal
  std::string overlong = "truncate";  // truncate | skip
  int64_t cutoff_len = 1024;
  bool train_on_inputs = false;
  double val_size = 0.0;
  int64_t max_samples = 0;
  uint64_t seed = 42;
  int threads = 0;  // tokenisation threads; 0 = every core
  // Polled while files are read and records tokenised (and between those phases): true stops the
  // preparation with StopRequested (dataset.h). The trainer passes its SIGINT/SIGTERM flag.
  StopCheck stop_requested;
};

struct PreparedData {
  ChatTemplate tmpl;
  std::vector<Sample> train, val;
  ReadStats read;
  TokenizeStats train_stats, val_stats;
};

// Throws StopRequested when cfg.stop_requested says so.
PreparedData prepare_data(const DataConfig& cfg, const LoadedTokenizer& tok);

}  // namespace lt::data
