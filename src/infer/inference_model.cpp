#include "infer/inference_model.h"

#include <omp.h>

#include <filesystem>

#include "core/error.h"
#include "io/model_io.h"

extern "C" void openblas_set_num_threads(int);

namespace lt::train {

LoadedModel load_model_for_inference(const std::string& model_dir, const std::string& tokenizer,
                                     const std::string& template_name, int64_t threads) {
  if (threads > 0) {
    openblas_set_num_threads(int(threads));
    omp_set_num_threads(int(threads));
  }
  namespace fs = std::filesystem;
  std::string tok = tokenizer.empty() ? model_dir : tokenizer;
  LT_CHECK(fs::exists(fs::path(tok)) && (fs::is_regular_file(tok) || fs::exists(fs::path(tok) / "tokenizer.json")),
           "no tokenizer.json in '{}'; pass --tokenizer", tok);
  data::LoadedTokenizer lt = data::load_tokenizer(tok);
  ModelWeights w = load_model(model_dir);
  LT_CHECK(lt.tokenizer.vocab_size() <= w.config.vocab, "tokenizer '{}' has {} ids but the model's vocab_size is {}",
           tok, lt.tokenizer.vocab_size(), w.config.vocab);
  auto tmpl = data::ChatTemplate::resolve(template_name, lt.tokenizer, lt.config);
  return LoadedModel{std::move(w), std::move(tmpl)};
}

}  // namespace lt::train
