// Checkpoints carry every tokenizer file of the model they were trained from. A model directory as
// current transformers writes it keeps its chat template only in chat_template.jinja; checkpoints
// dropped that file, so `generate`, `tokenize --chat` (and transformers' apply_chat_template) on a
// checkpoint had no template.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../common/repo_path.h"
#include "../common/test_dir.h"
#include "data/chat_template.h"
#include "infer/inference_model.h"
#include "io/model_io.h"
#include "model/init.h"
#include "train/checkpoint_dir.h"
#include "train/config.h"
#include "train/trainer.h"

using namespace lt;
using namespace lt::train;

namespace {

const char* kTemplate =
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// The tokenizer-side files of the model directory, besides tokenizer.json, and their contents.
const std::vector<std::pair<std::string, std::string>> kTokenizerSideFiles = {
    {"tokenizer_config.json", R"({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})"},
    {"chat_template.jinja", kTemplate},
    {"special_tokens_map.json", R"({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})"},
    {"added_tokens.json", R"({"<|endoftext|>": 303, "<|im_start|>": 304, "<|im_end|>": 305})"},
    {"vocab.json", R"({"a": 0})"},
    {"merges.txt", "#version: 0.2\n"},
    {"generation_config.json", R"({"eos_token_id": [305, 303], "pad_token_id": 303, "temperature": 0.7})"},
    {"additional_chat_templates/tool_use.jinja", "{{ messages|length }}"},
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct TmpDir : lt::testing::TestDir {
  TmpDir() : TestDir("lt_ckpt_tok_") {}
};

// A model directory as current transformers saves it: weights (vocab of the demo tokenizer), and the
// tokenizer files with the chat template only in chat_template.jinja.
void write_model_dir(const fs::path& dir) {
  ModelConfig c = preset_config("tiny-qwen2");
  c.vocab = 306;
  save_model(dir, random_model(c, 5));
  fs::copy_file(lt::testing::repo_root() / "configs/demo/tokenizer.json", dir / "tokenizer.json");
  for (const auto& [name, text] : kTokenizerSideFiles) {
    fs::create_directories((dir / name).parent_path());
    std::ofstream(dir / name, std::ios::binary) << text;
  }
}

TrainConfig run_config(const std::string& model, const fs::path& out, const std::vector<std::string>& extra = {}) {
  const std::string yaml =
      "model_name_or_path: " + model + "\ndataset: builtin:math\nmax_samples: 16\ncutoff_len: 96\n"
      "per_device_train_batch_size: 2\nmax_steps: 2\nsave_steps: 1\nprogress_bar: false\nthreads: 1\n"
      "output_dir: " + out.string() + "\n";
  return parse_config(yaml, "run.yaml", extra);
}

TrainHooks quiet_hooks() {
  TrainHooks h;
  h.install_signal_handlers = false;
  return h;
}

// Each tokenizer file of `from` is in the checkpoint, byte for byte.
void expect_tokenizer_files(const fs::path& from, const fs::path& ckpt) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                           "added_tokens.json", "vocab.json", "merges.txt", "generation_config.json",
                           "additional_chat_templates/tool_use.jinja"}) {
    ASSERT_TRUE(fs::exists(ckpt / name)) << ckpt.string() << " lacks " << name;
    EXPECT_EQ(slurp(ckpt / name), slurp(from / name)) << name;
  }
}

// The checkpoint's own template renders as the model's: generate's template loading and the data path.
void expect_template_loads(const fs::path& model_dir, const fs::path& ckpt) {
  const data::LoadedTokenizer tok = data::load_tokenizer(ckpt.string());
  EXPECT_EQ(tok.config.chat_template, kTemplate);
  EXPECT_EQ(tok.config.chat_template_origin, (ckpt / "chat_template.jinja").string());
  const LoadedModel m = load_model_for_inference(ckpt.string(), "", "auto", 1);
  EXPECT_EQ(m.tmpl.kind(), data::TemplateKind::Jinja);
  const data::LoadedTokenizer src = data::load_tokenizer(model_dir.string());
  const data::ChatTemplate want = data::ChatTemplate::resolve("auto", src.tokenizer, src.config);
  const std::vector<data::Message> chat = {{"user", "What is 1 + 2?"}};
  EXPECT_EQ(m.tmpl.encode_prompt(chat), want.encode_prompt(chat));
  EXPECT_EQ(m.tmpl.stop_ids(), want.stop_ids());
}

}  // namespace

TEST(CheckpointTokenizerFiles, ChatTemplateJinjaAndTokenizerSideFilesTravelIntoEveryCheckpoint) {
  TmpDir t;
  const fs::path model = t.p / "model", out = t.p / "out";
  write_model_dir(model);
  run_training(run_config(model.string(), out), quiet_hooks());
  for (int step : {1, 2}) {
    SCOPED_TRACE("checkpoint-" + std::to_string(step));
    expect_tokenizer_files(model, checkpoint_path(out, step));
    expect_template_loads(model, checkpoint_path(out, step));
  }
  // Resumed, the tokenizer is the checkpoint's: the next checkpoint still has every file.
  run_training(run_config(model.string(), out, {"max_steps=3", "resume_from_checkpoint=auto"}), quiet_hooks());
  expect_tokenizer_files(model, checkpoint_path(out, 3));
  expect_template_loads(model, checkpoint_path(out, 3));
}

// `tokenizer:` naming a tokenizer.json: the files beside it (which load_tokenizer reads) travel too.
TEST(CheckpointTokenizerFiles, TokenizerGivenAsAFileBringsItsDirectorysFiles) {
  TmpDir t;
  const fs::path model = t.p / "model", out = t.p / "out";
  write_model_dir(model);
  run_training(run_config("tiny-qwen2", out, {"tokenizer=" + (model / "tokenizer.json").string(), "max_steps=1"}),
               quiet_hooks());
  expect_tokenizer_files(model, checkpoint_path(out, 1));
  EXPECT_EQ(data::load_tokenizer(checkpoint_path(out, 1).string()).config.chat_template, kTemplate);
}
