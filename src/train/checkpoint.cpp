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

fs::path save_checkpoint(const fs::path& output_dir, const CheckpointContents& c, int64_t save_total_limit) {
  LT_CHECK(c.model && c.layout && (c.optimizer || c.write_optimizer), "save_checkpoint: incomplete contents");
  CheckpointWriter w(output_dir, c.state.global_step);
  const fs::path& d = w.dir();
  // HF model directory (what transformers loads).
  SaveOptions so;
  so.dtype = c.save_fp32_model ? DType::F32 : DType::BF16;
  so.passthrough_from = c.passthrough_from;
  save_model(d, *c.model, *c.layout, c.masters, so);
  if (!c.tokenizer_dir.empty() && fs::is_directory(c.tokenizer_dir)) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                          "merges.txt"}) {
      if (fs::exists(c.tokenizer_dir / f)) fs::copy_file(c.tokenizer_dir / f, d / f, fs::copy_options::overwrite_existing);
    }
  } else if (!c.tokenizer_dir.empty() && fs::is_regular_file(c.tokenizer_dir)) {
    fs::copy_file(c.tokenizer_dir, d / "tokenizer.json", fs::copy_options::overwrite_existing);
  }
  write_file_durable(d / "trainer_config.yaml", c.config_yaml);
  // Trainer state, kept apart from the model files.
  fs::create_directories(d / "trainer_state");
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
                             const UnitSink& masters, optim::CpuAdamW* optimizer) {
  load_weights(ckpt / "trainer_state" / "master", c, layout, masters);
  if (optimizer) optimizer->load(ckpt / "trainer_state" / "optimizer.bin");
}

}  // namespace lt::train
