// Tokenised training samples: records -> (input ids, HF-convention labels) through a chat template,
// with the cutoff_len policy for over-long samples.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "data/dataset.h"

namespace lt::data {

constexpr int32_t kIgnoreLabel = -100;

struct Sample {
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;  // HF convention, unshifted: labels[t] = ids[t] where token t carries loss, else -100
  // Loss targets after shifting (labels[t] != -100 for t >= 1): what this sample adds to n_loss_tokens.
  int64_t n_loss() const;
};

enum class Overlong { Truncate, Skip };
Overlong parse_overlong(const std::string& name);  // truncate | skip

struct TokenizeOptions {
  int64_t cutoff_len = 1024;
  Overlong overlong = Overlong::Truncate;  // truncate keeps the first cutoff_len tokens
  bool train_on_inputs = false;
  // Threads encoding records at once: 0 = every core (std::thread::hardware_concurrency()). The
  // result (samples, their order, stats, the error thrown for a bad record) does not depend on it.
  int threads = 0;
  // Checked before each block of records: true stops the encoding with StopRequested (dataset.h).
  StopCheck stop_requested;
};

struct TokenizeStats {
  int64_t samples = 0;       // kept
  int64_t truncated = 0;
  int64_t skipped_long = 0;  // over-long and overlong=skip
  int64_t skipped_no_loss = 0;  // no loss token left (e.g. the response was truncated away)
  int64_t tokens = 0;        // total tokens of kept samples
  int64_t loss_tokens = 0;   // total shifted loss targets of kept samples
};

Sample make_sample(const Encoded& e);
// Records are rendered and encoded in parallel (opt.threads), in blocks taken in order; samples keep
// the records' order. A record that cannot be encoded (unknown role, a template's raise_exception)
// throws the error of the first such record, as one thread would; a stop request throws StopRequested.
std::vector<Sample> tokenize_records(const std::vector<Record>& records, const ChatTemplate& tmpl,
                                     const TokenizeOptions& opt, TokenizeStats* stats = nullptr);

}  // namespace lt::data
