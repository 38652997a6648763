// `lazytrain eval --model DIR --dataset JSONL|builtin:math-test`: exact match with greedy decoding.
#include <cstdio>

#include "cli/commands.h"
#include "cli/inference_options.h"
#include "core/error.h"
#include "data/dataset.h"
#include "infer/evaluate.h"

namespace lt::cli {

// Where `eval` writes its per-sample results without --output: the current directory, never the
// model or checkpoint directory (a checkpoint stays as the trainer wrote it).
constexpr const char* kDefaultEvalOutput = "eval_results.jsonl";

void add_eval(CLI::App& app) {
  auto* sub = app.add_subcommand("eval", "Exact-match evaluation of a model directory or checkpoint on a JSONL test set");
  struct Opts : InferenceOptions {
    std::string dataset, output;
    int64_t max_samples = 0;
    uint64_t seed = 42;
  };
  auto o = std::make_shared<Opts>();
  o->batch_size = 64;
  o->max_new_tokens = 64;
  o->add_to(sub);
  sub->add_option("--dataset", o->dataset, "JSONL test set ({query,response}, alpaca, messages) or builtin:math-test")
      ->required();
  sub->add_option("--max-samples", o->max_samples, "evaluate at most N records (0 = all)");
  sub->add_option("--output", o->output,
                  "per-sample results JSONL (default: eval_results.jsonl in the current directory; the model "
                  "directory is left untouched)");
  sub->add_option("--seed", o->seed, "seed for builtin data sets");
  sub->callback([o] {
    o->check();
    train::LoadedModel m = o->load();
    data::ReadOptions ro;
    ro.max_samples = o->max_samples;
    ro.seed = o->seed;
    auto records = data::load_records(o->dataset, ro);
    if (o->max_samples > 0 && int64_t(records.size()) > o->max_samples) records.resize(size_t(o->max_samples));
    train::EvalOptions eo;
    eo.batch_size = o->batch_size;
    eo.max_new_tokens = o->max_new_tokens;
    eo.output_jsonl = o->output.empty() ? std::string(kDefaultEvalOutput) : o->output;
    eo.progress = true;
    auto gen = o->make_generator(m, train::longest_prompt_tokens(m.tmpl, records), int64_t(records.size()));
    auto r = train::evaluate_exact_match(*gen, m.tmpl, records, eo);
    std::printf("exact match: %.2f%% (%lld/%lld), %lld without an answer; %.1f s, %.0f generated tokens/s\n"
                "per-sample results: %s\n",
                100.0 * r.exact_match, (long long)r.correct, (long long)r.samples, (long long)r.no_answer, r.seconds,
                r.seconds > 0 ? double(r.generated_tokens) / r.seconds : 0.0, eo.output_jsonl.c_str());
    std::printf("%s\n", train::format_decode_stats(gen->describe(), gen->stats()).c_str());
  });
}

}  // namespace lt::cli
