// Where each key of a training config lives in TrainConfig's sections, the values its enums and
// auto-or-count keys (device_update_layers, gradient_ring_depth) accept, and the checks across keys (validate_config).
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "core/units.h"
#include "plan/heuristics.h"
#include "train/config_fields.h"

namespace lt::train {
namespace {

Slot slot_of(const char*, std::string* p) { return p; }
Slot slot_of(const char*, int64_t* p) { return p; }
Slot slot_of(const char*, double* p) { return p; }
Slot slot_of(const char*, bool* p) { return p; }

template <class E>
  requires std::is_enum_v<E>
Slot slot_of(const char* key, E* p) {
  return TextSlot{[p] { return std::string(name_of(*p)); },
                  [p, key](const std::string& text, const std::string& source) {
                    if (!choice_of(text, *p))
                      fail("{}: {} = '{}' is not valid; expected one of: {}", source, key, text,
                           fmt::join(choice_names<E>(), ", "));
                  }};
}

// "auto" or a count of layers >= min (device_update_layers: 0, gradient_ring_depth: 1).
Slot slot_of(const char* key, std::optional<int64_t>* p, int64_t min) {
  return TextSlot{[p] { return *p ? std::to_string(**p) : std::string("auto"); },
                  [p, key, min](const std::string& text, const std::string& source) {
                    *p = parse_auto_count(text, fmt::format("{}: {}", source, key), min);
                  }};
}

template <class S, class T>
Field field(const char* key, S TrainConfig::*section, T S::*member) {
  return {key, [key, section, member](TrainConfig& c) { return slot_of(key, &(c.*section.*member)); }};
}

template <class S>
Field auto_count_field(const char* key, S TrainConfig::*section, std::optional<int64_t> S::*member, int64_t min) {
  return {key, [key, section, member, min](TrainConfig& c) { return slot_of(key, &(c.*section.*member), min); }};
}

}  // namespace

// One row per key, in documentation order. "template" maps to template_name (a C++ keyword).
const std::vector<Field>& config_fields() {
  using C = TrainConfig;
  using Mo = ModelSection;
  using D = DataSection;
  using S = ScheduleSection;
  using Op = OptimizerSection;
  using P = PlacementSection;
  using E = EvalSection;
  using O = OutputSection;
  static const std::vector<Field> f = {
      field("model_name_or_path", &C::model, &Mo::name_or_path),
      field("model_overrides", &C::model, &Mo::overrides),
      field("tokenizer", &C::model, &Mo::tokenizer),
      field("dataset", &C::data, &D::dataset),
      field("eval_dataset", &C::data, &D::eval_dataset),
      field("template", &C::data, &D::template_name),
      field("cutoff_len", &C::data, &D::cutoff_len),
      field("packing", &C::data, &D::packing),
      field("train_on_inputs", &C::data, &D::train_on_inputs),
      field("val_size", &C::data, &D::val_size),
      field("max_samples", &C::data, &D::max_samples),
      field("dataset_format", &C::data, &D::dataset_format),
      field("on_malformed", &C::data, &D::on_malformed),
      field("overlong", &C::data, &D::overlong),
      field("per_device_train_batch_size", &C::schedule, &S::per_device_train_batch_size),
      field("per_device_eval_batch_size", &C::eval, &E::per_device_eval_batch_size),
      field("gradient_accumulation_steps", &C::schedule, &S::gradient_accumulation_steps),
      field("learning_rate", &C::schedule, &S::learning_rate),
      field("lr_scheduler_type", &C::schedule, &S::lr_scheduler_type),
      field("warmup_ratio", &C::schedule, &S::warmup_ratio),
      field("warmup_steps", &C::schedule, &S::warmup_steps),
      field("min_lr_ratio", &C::schedule, &S::min_lr_ratio),
      field("weight_decay", &C::optimizer, &Op::weight_decay),
      field("adam_beta1", &C::optimizer, &Op::adam_beta1),
      field("adam_beta2", &C::optimizer, &Op::adam_beta2),
      field("adam_epsilon", &C::optimizer, &Op::adam_epsilon),
      field("max_grad_norm", &C::optimizer, &Op::max_grad_norm),
      field("max_skipped_steps", &C::schedule, &S::max_skipped_steps),
      field("num_train_epochs", &C::schedule, &S::num_train_epochs),
      field("max_steps", &C::schedule, &S::max_steps),
      field("logging_steps", &C::output, &O::logging_steps),
      field("save_steps", &C::output, &O::save_steps),
      field("save_total_limit", &C::output, &O::save_total_limit),
      field("eval_steps", &C::eval, &E::eval_steps),
      field("save_dtype", &C::output, &O::save_dtype),
      field("save_final", &C::output, &O::save_final),
      field("output_dir", &C::output, &O::output_dir),
      field("overwrite_output_dir", &C::output, &O::overwrite_output_dir),
      field("seed", &C::schedule, &S::seed),
      field("resume_from_checkpoint", &C::output, &O::resume_from_checkpoint),
      field("gpu_mem", &C::placement, &P::gpu_mem),
      field("host_mem", &C::placement, &P::host_mem),
      field("nvme_dir", &C::placement, &P::nvme_dir),
      field("nvme_mem", &C::placement, &P::nvme_mem),
      field("planner", &C::placement, &P::planner),
      field("profile", &C::placement, &P::profile),
      field("optimizer", &C::optimizer, &Op::type),
      field("master_weights", &C::placement, &P::master_weights),
      field("gradients", &C::placement, &P::gradients),
      field("gradient_dtype", &C::placement, &P::gradient_dtype),
      field("optimizer_nvme", &C::placement, &P::optimizer_nvme),
      field("keep_internals", &C::placement, &P::keep_internals),
      field("embedding_rows_first", &C::placement, &P::embedding_rows_first),
      auto_count_field("gradient_ring_depth", &C::placement, &P::gradient_ring_depth, 1),
      field("head_gradient", &C::placement, &P::head_gradient),
      field("embedding_update", &C::placement, &P::embedding_update),
      auto_count_field("device_update_layers", &C::placement, &P::device_update_layers, 0),
      field("backend", &C::placement, &P::backend),
      field("threads", &C::placement, &P::threads),
      field("peak_tflops", &C::output, &O::peak_tflops),
      field("progress_bar", &C::output, &O::progress_bar),
      field("trace", &C::output, &O::trace),
      field("trace_step", &C::output, &O::trace_step),
      field("do_eval_dataset", &C::eval, &E::do_eval_dataset),
      field("eval_max_samples", &C::eval, &E::eval_max_samples),
      field("max_new_tokens", &C::eval, &E::max_new_tokens),
  };
  return f;
}

std::optional<int64_t> parse_auto_count(const std::string& v, const std::string& what, int64_t min) {
  if (v == "auto") return std::nullopt;
  size_t used = 0;
  long long k = -1;
  try {
    k = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  LT_CHECK(used == v.size() && !v.empty() && k >= min,
           "{} must be auto or a count of layers >= {}, got '{}'", what, min, v);
  return int64_t(k);
}

namespace {

// "inf", "-inf" or "nan" (a NaN's sign bit is not shown).
std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  return fmt::format("{}", v);
}

// Every float key holds a finite number (parse_config rejects .inf and .nan as written; this covers configs
// built in code).
void check_finite_numbers(const TrainConfig& c) {
  for (const auto& f : config_fields()) {
    const Slot s = read_slot(f, c);
    if (const auto* m = std::get_if<double*>(&s))
      LT_CHECK(std::isfinite(**m), "config: {} must be a finite number, got {}", f.key, number_text(**m));
  }
}

void positive(const char* key, int64_t v) { LT_CHECK(v > 0, "config: {} must be > 0, got {}", key, v); }

void validate_numbers(const TrainConfig& c) {
  const ScheduleSection& s = c.schedule;
  positive("cutoff_len", c.data.cutoff_len);
  positive("per_device_train_batch_size", s.per_device_train_batch_size);
  positive("gradient_accumulation_steps", s.gradient_accumulation_steps);
  positive("logging_steps", c.output.logging_steps);
  positive("max_new_tokens", c.eval.max_new_tokens);
  LT_CHECK(c.eval.per_device_eval_batch_size >= 0, "config: per_device_eval_batch_size must be >= 0, got {}",
           c.eval.per_device_eval_batch_size);
  LT_CHECK(s.learning_rate >= 0, "config: learning_rate must be >= 0, got {}", s.learning_rate);
  LT_CHECK(s.warmup_ratio >= 0 && s.warmup_ratio <= 1, "config: warmup_ratio must be in [0, 1], got {}", s.warmup_ratio);
  LT_CHECK(s.warmup_steps >= 0, "config: warmup_steps must be >= 0, got {}", s.warmup_steps);
  LT_CHECK(c.placement.threads >= 0, "config: threads must be >= 0 (0 = all cores), got {}", c.placement.threads);
  LT_CHECK(s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1, "config: min_lr_ratio must be in [0, 1], got {}", s.min_lr_ratio);
  LT_CHECK(c.optimizer.weight_decay >= 0, "config: weight_decay must be >= 0, got {}", c.optimizer.weight_decay);
  LT_CHECK(s.max_skipped_steps >= 0,
           "config: max_skipped_steps must be an integer >= 0 (the step that makes this many non-finite steps in a "
           "row stops training; 0: the first), got {}",
           s.max_skipped_steps);
  LT_CHECK(s.max_steps > 0 || s.num_train_epochs > 0, "config: set max_steps > 0 or num_train_epochs > 0");
  LT_CHECK(c.output.save_steps >= 0 && c.output.save_total_limit >= 0 && c.eval.eval_steps >= 0,
           "config: save_steps, save_total_limit and eval_steps must be >= 0");
  LT_CHECK(c.data.val_size >= 0, "config: val_size must be >= 0, got {}", c.data.val_size);
  LT_CHECK(!c.output.output_dir.empty(), "config: output_dir must not be empty");
}

void validate_placement(const PlacementSection& p) {
  if (p.device_update_layers)  // a config built in code; parsed ones are "auto" or a count >= 0
    LT_CHECK(*p.device_update_layers >= 0, "config: device_update_layers must be auto or a count of layers >= 0, "
             "got '{}'", *p.device_update_layers);
  if (p.gradient_ring_depth)  // a config built in code; parsed ones are "auto" or a count >= 1
    LT_CHECK(*p.gradient_ring_depth >= 1 && *p.gradient_ring_depth <= 1024,
             "config: gradient_ring_depth must be auto or a count of layers in [1, 1024], got {}", *p.gradient_ring_depth);
  LT_CHECK(p.optimizer_nvme == OptimizerNvme::None || !p.nvme_dir.empty(),
           "config: optimizer_nvme: {} may keep layers' optimizer moments in files on NVMe and needs nvme_dir (a "
           "directory on a local SSD)", name_of(p.optimizer_nvme));
  (void)canonical_planner(p.planner);  // the same names as `plan --planner` (plan/heuristics.h); resolved in planning
  for (auto [key, v] : {std::pair{"gpu_mem", &p.gpu_mem}, {"host_mem", &p.host_mem}, {"nvme_mem", &p.nvme_mem}}) {
    if (v->empty()) continue;
    try {
      parse_bytes(*v);
    } catch (const Error& e) {
      fail("config: {}: {}", key, e.what());
    }
  }
}

}  // namespace

void validate_config(const TrainConfig& c) {
  LT_CHECK(!c.model.name_or_path.empty(),
           "config: model_name_or_path is required (a model directory or a preset name)");
  check_finite_numbers(c);
  validate_numbers(c);
  validate_placement(c.placement);
}

}  // namespace lt::train
