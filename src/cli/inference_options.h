// Options shared by the decoding commands (`eval`, `generate`): which model, tokenizer and template,
// how decoding is batched, and where it runs (CPU, or the GPU with resident or streamed weights).
// Each command sets its own defaults before registering them.
#pragma once
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "infer/gpu_decode.h"
#include "core/error.h"
#include "infer/decode_device.h"
#include "infer/inference_model.h"

namespace lt::cli {

struct InferenceOptions {
  std::string model, tokenizer, template_name = "auto";
  int64_t batch_size = 32, max_new_tokens = 64, threads = 0;
  std::string device = "auto", weights = "auto";
  double gpu_mem = 0;  // GiB

  void add_to(CLI::App* sub) {
    sub->add_option("--model", model, "model directory or checkpoint-<step> directory")->required();
    sub->add_option("--tokenizer", tokenizer, "tokenizer.json or its directory (default: the model directory)");
    sub->add_option("--template", template_name, "chat template: auto | chatml | llama3 | none");
    sub->add_option("--batch-size", batch_size, "sequences decoded together");
    sub->add_option("--max-new-tokens", max_new_tokens, "generation limit per sequence");
    sub->add_option("--threads", threads, "CPU threads (0 = all)");
    sub->add_option("--device", device, "auto | cpu | cuda (auto: the GPU when this build has CUDA and one is visible)")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    sub->add_option("--gpu-mem", gpu_mem, "GPU memory cap in GiB for CUDA decoding (default: free device memory)")
        ->check(CLI::NonNegativeNumber);
    sub->add_option("--weights", weights,
                    "CUDA decoding: auto | resident | streamed (auto: resident when weights + KV cache fit --gpu-mem)")
        ->check(CLI::IsMember({"auto", "resident", "streamed"}));
  }
  // Checks the options that need no model (before loading one): lt::Error naming the flag.
  void check() const {
    LT_CHECK(batch_size >= 1, "--batch-size must be >= 1 (sequences decoded together), got {}", batch_size);
    LT_CHECK(threads >= 0, "--threads must be >= 0 (0 = all cores), got {}", threads);
    train::check_max_new_tokens(max_new_tokens, "--max-new-tokens");
  }
  train::LoadedModel load() const { return train::load_model_for_inference(model, tokenizer, template_name, threads); }

  // Parsed and checked device options; the KV cache is sized for min(batch, n_prompts) sequences of
  // longest_prompt + max_new_tokens tokens.
  train::DecodeDeviceOptions decode_options(int64_t longest_prompt, int64_t n_prompts) const {
    train::DecodeDeviceOptions o;
    o.device = train::parse_decode_device(device);
    o.weights = parse_weights_mode(weights);
    o.gpu_mem_gib = gpu_mem;
    o.size_for(batch_size, n_prompts, longest_prompt, max_new_tokens);
    return o;
  }
  std::unique_ptr<train::Generator> make_generator(const train::LoadedModel& m, int64_t longest_prompt,
                                                   int64_t n_prompts) const {
    train::check_fits_max_position(m.weights.config, longest_prompt, max_new_tokens, "--max-new-tokens");
    return train::make_generator(m.view(), decode_options(longest_prompt, n_prompts), infer::gpu_decode_hooks());
  }
};

}  // namespace lt::cli
