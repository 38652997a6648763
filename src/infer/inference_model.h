// Shared by `eval` and `generate`: a model directory (or checkpoint) loaded to fp32 for CPU decoding,
// with its tokenizer and chat template.
#pragma once
#include <string>

#include "data/chat_template.h"
#include "infer/generate.h"
#include "model/weights.h"

namespace lt::train {

struct LoadedModel {
  ModelWeights weights;
  data::ChatTemplate tmpl;
  ModelWeightsView view() const { return view_of(weights); }
};

LoadedModel load_model_for_inference(const std::string& model_dir, const std::string& tokenizer,
                                     const std::string& template_name, int64_t threads);

}  // namespace lt::train
