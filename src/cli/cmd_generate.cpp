// `lazytrain generate --model DIR --prompt TEXT [...]`: batched greedy decoding with a KV cache.
#include <cstdio>
#include <algorithm>
#include <fstream>

#include "cli/commands.h"
#include "cli/inference_options.h"
#include "core/error.h"
#include "infer/generate.h"

namespace lt::cli {

void add_generate(CLI::App& app) {
  auto* sub = app.add_subcommand("generate", "Greedy generation from a model directory or checkpoint");
  struct Opts : InferenceOptions {
    std::string prompts_file;
    std::vector<std::string> prompts;
    bool raw = false;
  };
  auto o = std::make_shared<Opts>();
  o->batch_size = 32;
  o->max_new_tokens = 128;
  o->add_to(sub);
  sub->add_option("--prompt,-p", o->prompts, "a user message (repeatable)");
  sub->add_option("--prompts-file", o->prompts_file, "one prompt per line");
  sub->add_flag("--raw", o->raw, "encode prompts as plain text (no chat template)");
  sub->callback([o] {
    o->check();
    std::vector<std::string> prompts = o->prompts;
    if (!o->prompts_file.empty()) {
      std::ifstream in(o->prompts_file);
      LT_CHECK(in.good(), "cannot open prompts file '{}'", o->prompts_file);
      for (std::string line; std::getline(in, line);)
        if (!line.empty()) prompts.push_back(line);
    }
    LT_CHECK(!prompts.empty(), "generate: no prompt (use --prompt or --prompts-file)");
    // --raw encodes plain text: no chat template is needed (the model's, if any, is not used).
    if (o->raw && o->template_name == "auto") o->template_name = "none";
    train::LoadedModel m = o->load();
    std::vector<std::vector<int32_t>> ids;
    for (const auto& p : prompts)
      ids.push_back(o->raw ? m.tmpl.tokenizer().encode(p, true) : m.tmpl.encode_prompt({{"user", p}}));
    int64_t longest = 0;
    for (const auto& p : ids) longest = std::max<int64_t>(longest, int64_t(p.size()));
    auto gen = o->make_generator(m, longest, int64_t(ids.size()));
    train::GenerateOptions g;
    g.max_new_tokens = o->max_new_tokens;
    g.batch_size = o->batch_size;
    g.stop_ids = m.tmpl.stop_ids();
    auto out = gen->generate(ids, g);
    for (size_t i = 0; i < out.size(); ++i)
      train::write_generation(stdout, i, prompts[i], m.tmpl.tokenizer(), out[i], g.stop_ids);
    std::fflush(stdout);
    std::fprintf(stderr, "%s (batch %lld)\n", train::format_decode_stats(gen->describe(), gen->stats()).c_str(),
                 (long long)o->batch_size);
  });
}

}  // namespace lt::cli
