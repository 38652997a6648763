// Exact-match evaluation: greedy generation for each record's prompt (chat template + generation
// prompt), the answer extracted from "The answer is: X" and compared after normalisation
// (answer.h), one JSONL line per sample with the generated text and the verdict.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "data/dataset.h"
#include "infer/generate.h"

namespace lt::train {

struct EvalOptions {
  int64_t batch_size = 64;
  int64_t max_new_tokens = 64;
  std::string output_jsonl;  // per-sample results; empty = none
  bool progress = false;     // print progress lines
};

struct EvalResult {
  int64_t samples = 0, correct = 0, no_answer = 0;
  double exact_match = 0;  // correct / samples
  double seconds = 0;
  int64_t generated_tokens = 0;
};

EvalResult evaluate_exact_match(Generator& gen, const data::ChatTemplate& tmpl,
                                const std::vector<data::Record>& records, const EvalOptions& opt);
// The same on the CPU.
EvalResult evaluate_exact_match(const ModelWeightsView& w, const data::ChatTemplate& tmpl,
                                const std::vector<data::Record>& records, const EvalOptions& opt);
// Tokens of the longest prompt (chat template + generation prompt): sizes a GPU decoder's KV cache.
int64_t longest_prompt_tokens(const data::ChatTemplate& tmpl, const std::vector<data::Record>& records);

}  // namespace lt::train
