#include "train/checkpoint.h"

#include <limits>

#include "core/error.h"
#include "io/model_io.h"
#include "train/checkpoint_dir.h"

namespace lt::train {

nlohmann::json trainer_state_to_json(const TrainerState& s) {
  return {{"format", "lazytrain-trainer-state"},
          {"version", 1},
          {"global_step", s.global_step},
          {"micro_batches_done", s.micro_batches_done},
          {"data_position", {{"epoch", s.data_epoch}, {"index", s.data_index}}},
          {"batches_per_epoch", s.batches_per_epoch},
          {"total_steps", s.total_steps},
          {"seed", s.seed},
          // The data order is a pure function of (seed, epoch) (data::DataLoader), so the data
          // position above is the whole RNG state of a run; there is no dropout.
          {"rng", {{"data_order", "seeded per epoch from seed"}, {"dropout", "none"}}},
          {"lr_schedule",
           {{"type", s.lr_scheduler_type}, {"base_lr", s.base_lr}, {"warmup_steps", s.warmup_steps},
            {"last_lr", s.last_lr}}},
          {"optimizer", s.optimizer},
          {"master_weights", s.master_weights},
          {"tensors_8bit", s.tensors_8bit},
          {"model", s.model_name},
          {"losses", s.losses},
          {"skipped_steps", s.skipped_steps},
          {"nonfinite_loss_steps", s.nonfinite_loss_steps}};
}

namespace {

// JSON has no NaN or infinity: a skipped step's non-finite loss is written as null and read back as NaN.
std::vector<double> losses_from_json(const nlohmann::json& j) {
  if (!j.is_array()) return j.get<std::vector<double>>();  // throws the usual type error
  std::vector<double> v;
  v.reserve(j.size());
  for (const auto& x : j) v.push_back(x.is_null() ? std::numeric_limits<double>::quiet_NaN() : x.get<double>());
  return v;
}

}  // namespace

TrainerState trainer_state_from_json(const nlohmann::json& j, const std::string& source) {
  try {
    LT_CHECK(j.value("format", "") == "lazytrain-trainer-state", "{}: not a lazytrain trainer state (field 'format')",
             source);
    LT_CHECK(j.at("version").get<int>() == 1, "{}: unsupported version {} (expected 1)", source,
             j.at("version").dump());
    TrainerState s;
    s.global_step = j.at("global_step").get<int64_t>();
    s.micro_batches_done = j.at("micro_batches_done").get<int64_t>();
    s.batches_per_epoch = j.at("batches_per_epoch").get<int64_t>();
    s.data_epoch = j.at("data_position").at("epoch").get<int64_t>();
    s.data_index = j.at("data_position").at("index").get<int64_t>();
    s.total_steps = j.at("total_steps").get<int64_t>();
    s.seed = j.at("seed").get<uint64_t>();
    const auto& ls = j.at("lr_schedule");
    s.lr_scheduler_type = ls.at("type").get<std::string>();
    s.base_lr = ls.at("base_lr").get<double>();
    s.warmup_steps = ls.at("warmup_steps").get<int64_t>();
    s.last_lr = ls.at("last_lr").get<double>();
    s.optimizer = j.at("optimizer").get<std::string>();
    s.master_weights = j.value("master_weights", std::string("fp32"));
    s.tensors_8bit = j.at("tensors_8bit").get<std::vector<std::string>>();
    s.model_name = j.value("model", "");
    s.losses = losses_from_json(j.at("losses"));
    s.skipped_steps = j.value("skipped_steps", int64_t(0));  // these two: absent in older checkpoints
    s.nonfinite_loss_steps = j.value("nonfinite_loss_steps", int64_t(0));
    return s;
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed trainer state: {}", source, e.what());
  }
}

namespace {

// The tokenizer-side files of an HF model directory, as transformers writes them (current versions
// keep the chat template in chat_template.jinja, not in tokenizer_config.json).
constexpr const char* kTokenizerFiles[] = {"tokenizer.json",          "tokenizer_config.json", "chat_template.jinja",
                                           "chat_template.json",      "special_tokens_map.json", "added_tokens.json",
                                           "vocab.json",              "merges.txt",              "tokenizer.model",
                                           "vocab.txt",               "generation_config.json"};
// Named chat templates besides the default one (transformers: additional_chat_templates/<name>.jinja).
constexpr const char* kAdditionalTemplatesDir = "additional_chat_templates";

void copy_file_into(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  LT_CHECK(!ec, "checkpoint: cannot copy tokenizer file '{}' to '{}': {}", from.string(), to.string(), ec.message());
}

// Copies every tokenizer file of `tokenizer` (a directory, or a tokenizer.json whose directory holds the
// others) into the checkpoint directory `dst`, so that the checkpoint tokenizes, renders its chat template
// and generates as the model it came from. A generation_config.json found there replaces the one
// save_model wrote from config.json (it keeps the model's own stop ids and generation defaults).
void copy_tokenizer_files(const fs::path& tokenizer, const fs::path& dst) {
  if (tokenizer.empty()) return;
  std::error_code ec;
  const bool is_file = fs::is_regular_file(tokenizer, ec);
  const fs::path dir = is_file ? tokenizer.parent_path() : tokenizer;
  if (!is_file && !fs::is_directory(dir, ec)) return;
  if (is_file) copy_file_into(tokenizer, dst / "tokenizer.json");
  for (const char* name : kTokenizerFiles) {
    if (is_file && std::string(name) == "tokenizer.json") continue;  // the file given is the tokenizer
    if (fs::is_regular_file(dir / name, ec)) copy_file_into(dir / name, dst / name);
  }
  const fs::path extra = dir / kAdditionalTemplatesDir;
  if (!fs::is_directory(extra, ec)) return;
  fs::create_directories(dst / kAdditionalTemplatesDir, ec);
  LT_CHECK(!ec, "checkpoint: cannot create '{}': {}", (dst / kAdditionalTemplatesDir).string(), ec.message());
  for (const auto& e : fs::directory_iterator(extra, ec))
    if (e.is_regular_file()) copy_file_into(e.path(), dst / kAdditionalTemplatesDir / e.path().filename());
  LT_CHECK(!ec, "checkpoint: cannot list '{}': {}", extra.string(), ec.message());
}

}  // namespace

fs::path save_checkpoint(const fs::path& output_dir, const CheckpointContents& c, int64_t save_total_limit) {
  LT_CHECK(c.model && c.layout && (c.optimizer || c.write_optimizer), "save_checkpoint: incomplete contents");
  CheckpointWriter w(output_dir, c.state.global_step);
  const fs::path& d = w.dir();
  // HF model directory (what transformers loads).
  SaveOptions so;
  so.dtype = c.save_fp32_model ? DType::F32 : DType::BF16;
  so.passthrough_from = c.passthrough_from;
  save_model(d, *c.model, *c.layout, c.masters, so);
  copy_tokenizer_files(c.tokenizer_dir, d);
  write_file_durable(d / "trainer_config.yaml", c.config_yaml);
  // Trainer state, kept apart from the model files.
  std::error_code ec;
  fs::create_directories(d / "trainer_state", ec);
  LT_CHECK(!ec, "checkpoint: cannot create '{}': {}", (d / "trainer_state").string(), ec.message());
  SaveOptions master_opt;
  master_opt.dtype = DType::F32;
  save_model(d / "trainer_state" / "master", *c.model, *c.layout, c.masters, master_opt);
  if (c.write_optimizer)
    c.write_optimizer(d / "trainer_state" / "optimizer.bin");
  else
    c.optimizer->save(d / "trainer_state" / "optimizer.bin");
  write_file_durable(d / "trainer_state" / "trainer_state.json", trainer_state_to_json(c.state).dump(1) + "\n");
  fs::path final_dir = w.commit();
  rotate_checkpoints(output_dir, save_total_limit);
  return final_dir;
}

TrainerState read_trainer_state(const fs::path& ckpt) {
  fs::path p = ckpt / "trainer_state" / "trainer_state.json";
  LT_CHECK(fs::exists(p), "checkpoint '{}' has no trainer state ({} missing): it is a model-only directory",
           ckpt.string(), p.string());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file_text(p));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", p.string(), e.what());
  }
  return trainer_state_from_json(j, p.string());
}

void load_checkpoint_weights(const fs::path& ckpt, const ModelConfig& c, const ModelLayout& layout,
                             const UnitSink& masters, const PieceSize& piece, optim::CpuAdamW* optimizer) {
  load_weights(ckpt / "trainer_state" / "master", c, layout, masters, piece);
  if (optimizer) optimizer->load(ckpt / "trainer_state" / "optimizer.bin");
}

}  // namespace lt::train
