// Options shared by the decoding commands (`eval`, `generate`): which model, tokenizer and template,
// and how decoding is batched. Each command sets its own defaults before registering them.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "train/inference_model.h"

namespace lt::cli {

struct InferenceOptions {
  std::string model, tokenizer, template_name = "auto";
  int64_t batch_size = 32, max_new_tokens = 64, threads = 0;

  void add_to(CLI::App* sub) {
    sub->add_option("--model", model, "model directory or checkpoint-<step> directory")->required();
    sub->add_option("--tokenizer", tokenizer, "tokenizer.json or its directory (default: the model directory)");
    sub->add_option("--template", template_name, "chat template: auto | chatml | llama3 | none");
    sub->add_option("--batch-size", batch_size, "sequences decoded together");
    sub->add_option("--max-new-tokens", max_new_tokens, "generation limit per sequence");
    sub->add_option("--threads", threads, "CPU threads (0 = all)");
  }
  train::LoadedModel load() const { return train::load_model_for_inference(model, tokenizer, template_name, threads); }
};

}  // namespace lt::cli
