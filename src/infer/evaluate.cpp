#include "infer/evaluate.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "infer/answer.h"

namespace lt::train {

int64_t longest_prompt_tokens(const data::ChatTemplate& tmpl, const std::vector<data::Record>& records) {
  int64_t n = 0;
  for (const auto& r : records) n = std::max<int64_t>(n, int64_t(tmpl.encode_prompt(r.prompt_messages()).size()));
  return n;
}

EvalResult evaluate_exact_match(const ModelWeightsView& w, const data::ChatTemplate& tmpl,
                                const std::vector<data::Record>& records, const EvalOptions& opt) {
  auto gen = make_cpu_generator(w);
  return evaluate_exact_match(*gen, tmpl, records, opt);
}

EvalResult evaluate_exact_match(Generator& generator, const data::ChatTemplate& tmpl,
                                const std::vector<data::Record>& records, const EvalOptions& opt) {
  EvalResult res;
  const double t0 = now_seconds();
  std::ofstream out;
  if (!opt.output_jsonl.empty()) {
    out.open(opt.output_jsonl);
    LT_CHECK(out.good(), "eval: cannot write '{}'", opt.output_jsonl);
  }
  GenerateOptions g;
  g.max_new_tokens = opt.max_new_tokens;
  g.batch_size = opt.batch_size;
  g.stop_ids = tmpl.stop_ids();
  // Batches of prompts so that progress can be reported and memory stays bounded.
  const size_t chunk = size_t(std::max<int64_t>(1, opt.batch_size)) * 4;
  for (size_t b0 = 0; b0 < records.size(); b0 += chunk) {
    const size_t nb = std::min(chunk, records.size() - b0);
    std::vector<std::vector<int32_t>> prompts;
    for (size_t i = 0; i < nb; ++i) prompts.push_back(tmpl.encode_prompt(records[b0 + i].prompt_messages()));
    auto gen = generator.generate(prompts, g);
    for (size_t i = 0; i < nb; ++i) {
      const auto& rec = records[b0 + i];
      std::vector<int32_t> ids = gen[i];
      res.generated_tokens += int64_t(ids.size());
      strip_stop(ids, g.stop_ids);
      std::string text = tmpl.tokenizer().decode(ids, true);
      std::string reference = rec.reference();
      auto pred = extract_answer(text);
      auto ref = extract_answer(reference);
      std::string ref_answer = ref ? *ref : reference;
      bool ok = pred && answers_match(*pred, ref_answer);
      res.samples++;
      res.correct += ok;
      res.no_answer += !pred;
      if (out.is_open()) {
        nlohmann::json j = {{"index", int64_t(b0 + i)},
                            {"prompt", rec.prompt_messages().empty() ? std::string() : rec.prompt_messages().back().content},
                            {"generated", text},
                            {"predicted_answer", pred ? nlohmann::json(*pred) : nlohmann::json(nullptr)},
                            {"reference_answer", ref_answer},
                            {"correct", ok}};
        if (rec.line > 0) j["line"] = rec.line;
        out << j.dump() << "\n";
      }
    }
    if (opt.progress)
      log_info("eval: {}/{} samples, exact match so far {:.1f}%", res.samples, records.size(),
               100.0 * double(res.correct) / double(res.samples));
  }
  res.exact_match = res.samples ? double(res.correct) / double(res.samples) : 0.0;
  res.seconds = now_seconds() - t0;
  return res;
}

}  // namespace lt::train
