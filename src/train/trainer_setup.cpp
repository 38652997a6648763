// Setting a training run up and closing it (trainer_setup.h); the loop itself is in trainer.cpp.
#include "train/trainer_setup.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "infer/evaluate.h"
#include "model/init.h"
#include "train/checkpoint_dir.h"
#include "train/signals.h"

namespace lt::train {

namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

optim::OptimizerKind optimizer_kind(OptimizerType t) {
  switch (t) {
    case OptimizerType::AdamW8bit: return optim::OptimizerKind::AdamW8bit;
    case OptimizerType::Hybrid: return optim::OptimizerKind::Hybrid;
    case OptimizerType::AdamW: break;
  }
  return optim::OptimizerKind::AdamW;
}

// Removes what a previous run left in output_dir when overwrite_output_dir is set (only our files).
void clear_output_dir(const fs::path& out) {
  std::error_code ec;
  if (!fs::is_directory(out, ec)) return;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    std::string n = e.path().filename().string();
    if (checkpoint_step(e.path()) >= 0 || n.rfind(".tmp-checkpoint-", 0) == 0 || n == "metrics.jsonl")
      fs::remove_all(e.path(), ec);
  }
}

}  // namespace

std::optional<fs::path> prepare_output_dir(const OutputSection& cfg, OutputLock& lock) {
  const fs::path out = cfg.output_dir;
  lock = OutputLock::acquire(out);  // before the resume point is chosen or anything removed
  std::optional<fs::path> resume = resolve_resume(cfg.resume_from_checkpoint, out);
  if (cfg.resume_from_checkpoint == "auto" && !resume)
    log_info("resume_from_checkpoint=auto: no complete checkpoint in {}, starting from scratch", out.string());
  if (!resume && !list_checkpoints(out).empty()) {
    LT_CHECK(cfg.overwrite_output_dir,
             "output_dir '{}' already has checkpoints; resume with resume_from_checkpoint=auto, or set "
             "overwrite_output_dir=true to start over (its checkpoints are deleted)",
             out.string());
    clear_output_dir(out);
  }
  fs::create_directories(out);
  return resume;
}

data::PreparedData load_training_data(const TrainConfig& config, const ModelSetup& ms) {
  const DataSection& cfg = config.data;
  // Positions past max_position_embeddings have no trained RoPE range (generate refuses them too).
  LT_CHECK(cfg.cutoff_len <= ms.model.max_position,
           "config: cutoff_len {} exceeds the model's max_position_embeddings {} ({}): a sample that long would be "
           "trained at positions the model does not have; set cutoff_len <= {} (longer records are then truncated or "
           "skipped as `overlong` says)",
           cfg.cutoff_len, ms.model.max_position, ms.model.name, ms.model.max_position);
  data::DataConfig dc;
  dc.dataset = cfg.dataset;
  dc.eval_dataset = cfg.eval_dataset;
  dc.template_name = cfg.template_name;
  dc.format = cfg.dataset_format;
  dc.on_malformed = name_of(cfg.on_malformed);
  dc.overlong = name_of(cfg.overlong);
  dc.cutoff_len = cfg.cutoff_len;
  dc.train_on_inputs = cfg.train_on_inputs;
  dc.val_size = cfg.val_size;
  dc.max_samples = cfg.max_samples;
  dc.seed = uint64_t(config.schedule.seed);
  dc.stop_requested = [] { return StopSignals::requested(); };
  data::PreparedData data = data::prepare_data(dc, ms.tokenizer);
  LT_CHECK(!data.train.empty(), "dataset '{}': no training samples left after tokenisation", cfg.dataset);
  for (const auto& s : data.train)
    for (int32_t id : s.ids)
      LT_CHECK(id >= 0 && id < ms.model.vocab,
               "token id {} is outside the model's vocabulary ({}): tokenizer and model do not match", id,
               ms.model.vocab);
  return data;
}

int64_t sequence_length(const DataSection& cfg, const data::PreparedData& data) {
  int64_t longest = 0;
  for (const auto& s : data.train) longest = std::max<int64_t>(longest, int64_t(s.ids.size()));
  for (const auto& s : data.val) longest = std::max<int64_t>(longest, int64_t(s.ids.size()));
  return cfg.packing ? cfg.cutoff_len : std::min(cfg.cutoff_len, round_up(longest, 8));
}

data::LoaderOptions loader_options(const TrainConfig& cfg, int64_t seq, int32_t pad_id) {
  data::LoaderOptions lo;
  lo.batch = cfg.schedule.per_device_train_batch_size;
  lo.seq = seq;
  lo.packing = cfg.data.packing;
  lo.shuffle = true;
  lo.seed = uint64_t(cfg.schedule.seed);
  lo.pad_id = pad_id;
  return lo;
}

StepShape step_shape(const ScheduleSection& cfg, int64_t seq, int64_t batches_per_epoch, int world) {
  StepShape s;
  s.seq = seq;
  s.batch = cfg.per_device_train_batch_size;
  s.world = world;
  s.rank_ga = cfg.gradient_accumulation_steps;
  s.ga = s.rank_ga * world;
  s.batches_per_epoch = batches_per_epoch;
  s.updates_per_epoch = std::max<int64_t>(1, batches_per_epoch / s.ga);
  s.total_steps = cfg.max_steps > 0
                      ? cfg.max_steps
                      : std::max<int64_t>(1, int64_t(std::ceil(cfg.num_train_epochs * double(s.updates_per_epoch))));
  s.sched = LrSchedule{cfg.lr_scheduler_type, cfg.learning_rate,
                       resolve_warmup_steps(cfg.warmup_steps, cfg.warmup_ratio, s.total_steps), s.total_steps,
                       cfg.min_lr_ratio};
  return s;
}

std::string batch_description(const StepShape& s) {
  std::string d = fmt::format("batch {} x {} accumulation", s.batch, s.rank_ga);
  if (s.world > 1) d += fmt::format(" x {} ranks", s.world);
  return d;
}

OptimizerSetup optimizer_setup(const TrainConfig& cfg, const TrainingPlan& tp, bool gpu) {
  const OptimizerSection& o = cfg.optimizer;
  OptimizerSetup os;
  os.weight_decay = float(o.weight_decay);
  os.beta1 = float(o.adam_beta1);
  os.beta2 = float(o.adam_beta2);
  os.eps = float(o.adam_epsilon);
  os.max_grad_norm = float(o.max_grad_norm);
  os.kind = optimizer_kind(o.type);
  os.tensors_8bit = tp.tensors_8bit;
  // On the CPU backend the compute lane needs the cores; one optimizer thread overlaps with it.
  os.threads = gpu ? int(cfg.placement.threads) : 1;
  os.sr_seed = rounding_seed(uint64_t(cfg.schedule.seed));
  // optimizer_nvme: all = every layer unit's moments on NVMe; auto = the plan's (the last
  // placement.nvme_layers layers, units L - k + 1 .. L).
  os.nvme_dir = cfg.placement.nvme_dir;
  os.nvme_queue = tp.nvme_queue;
  os.nvme_all_layers = cfg.placement.optimizer_nvme == OptimizerNvme::All;
  const int64_t L = tp.model.layers;
  for (int64_t j = L - tp.placement.nvme_layers; j < L; ++j) os.nvme_units.insert(j + 1);
  os.nvme_remainders = tp.placement.nvme_remainders;  // those units' master remainders in their NVMe images
  return os;
}

HostStateOptions host_state_options(const TrainingPlan& tp) {
  HostStateOptions o;
  o.master = tp.placement.master;
  o.grads = tp.placement.grads;
  o.grad_dtype = tp.placement.grad_dtype;
  o.embedding_update_device = tp.placement.embedding_update_device;
  o.device_update_layers = tp.placement.device_update_layers;
  o.grad_ring_depth = tp.placement.grad_ring_depth;
  o.head_grad_slices = tp.placement.head_grad_slices;
  // Units whose gradient the host computes (the embedding when its table is not on the device).
  if (o.grads == GradHome::Device) o.host_grad_units = host_grad_units(tp.model, tp.exec);
  // The NVMe-moment layers' remainders (units L - k + 1 .. L, as optimizer_setup's nvme_units): never in DRAM.
  if (tp.placement.nvme_remainders)
    for (int64_t j = tp.model.layers - tp.placement.nvme_layers; j < tp.model.layers; ++j)
      o.nvme_remainder_units.insert(j + 1);
  return o;
}

uint64_t rounding_seed(uint64_t seed) { return seed * 0x2545f4914f6cdd1dull + 0x5eed; }

namespace {

// The masters are written in pieces (HostState::master_write_piece): the fp32 buffer beside the optimizer's state (made
// first) is 64 MiB, not the largest unit (the 27B shape's embedding: 5 GiB).
UnitSink master_sink(HostState& st) {
  return [&st](int64_t u, int64_t off, int64_t n, const float* v) { st.write_master(u, off, n, v); };
}
PieceSize master_pieces(const HostState& st) {
  return [&st](int64_t u) { return st.master_write_piece(u); };
}

}  // namespace

void write_initial_weights(const ModelSetup& ms, HostState& st, int threads) {
  const InitialWeights& iw = ms.initial;
  if (iw.source == InitialWeights::Source::Checkpoint) return;
  for (int64_t u = 0; u < st.units(); ++u)
    LT_CHECK(st.numel(u) == ms.layout.units[size_t(u)].numel, "internal: unit {} size mismatch", u);
  if (iw.source == InitialWeights::Source::Pretrained) {
    load_weights(iw.dir, ms.model, ms.layout, master_sink(st), master_pieces(st), threads);
    return;
  }
  int64_t largest = 0;
  for (int64_t u = 0; u < st.units(); ++u) largest = std::max(largest, st.master_write_piece(u));
  std::vector<float> buf(static_cast<size_t>(largest));
  for (int64_t u = 0; u < st.units(); ++u) {
    const int64_t step = std::max<int64_t>(st.master_write_piece(u), 1);
    for (int64_t off = 0; off < st.numel(u); off += step) {
      if (StopSignals::requested()) throw data::StopRequested("while initialising the weights");
      const int64_t n = std::min(step, st.numel(u) - off);
      init_unit_part(ms.model, ms.layout.units[size_t(u)], off, n, buf.data(), iw.seed, threads);
      st.write_master(u, off, n, buf.data());
    }
  }
}

TrainerState initial_trainer_state(const TrainConfig& cfg, const StepShape& shape, const TrainingPlan& tp,
                                   const ModelSetup& ms) {
  TrainerState ts;
  ts.batches_per_epoch = shape.batches_per_epoch;
  ts.total_steps = shape.total_steps;
  ts.seed = uint64_t(cfg.schedule.seed);
  ts.lr_scheduler_type = name_of(cfg.schedule.lr_scheduler_type);
  ts.base_lr = cfg.schedule.learning_rate;
  ts.warmup_steps = shape.sched.warmup_steps;
  ts.optimizer = name_of(cfg.optimizer.type);
  ts.master_weights = master_mode_name(tp.placement.master);
  ts.tensors_8bit.assign(tp.tensors_8bit.begin(), tp.tensors_8bit.end());
  ts.model_name = ms.model.name;
  return ts;
}

void resume_from(const fs::path& ckpt, const TrainConfig& cfg, const ModelSetup& ms, HostState& st,
                 optim::CpuAdamW& opt, const std::function<void(const fs::path&)>& load_optimizer,
                 data::DataLoader& loader, TrainerState& ts) {
  TrainerState saved = read_trainer_state(ckpt);
  LT_CHECK(saved.batches_per_epoch == ts.batches_per_epoch,
           "resume: checkpoint '{}' was made with {} micro-batches per epoch, this run has {} (dataset, "
           "batch size, cutoff_len or packing changed)",
           ckpt.string(), saved.batches_per_epoch, ts.batches_per_epoch);
  LT_CHECK(saved.optimizer == name_of(cfg.optimizer.type),
           "resume: checkpoint '{}' used optimizer '{}', the config says '{}'", ckpt.string(), saved.optimizer,
           name_of(cfg.optimizer.type));
  LT_CHECK(saved.master_weights == ts.master_weights,
           "resume: checkpoint '{}' trained with master_weights '{}', this run's is '{}' (master_weights: {})",
           ckpt.string(), saved.master_weights, ts.master_weights, name_of(cfg.placement.master_weights));
  // bf16-sr: the rounding continues the checkpoint's random stream.
  opt.set_sr_seed(rounding_seed(saved.seed));
  if (saved.total_steps != ts.total_steps)
    log_warn("resume: total steps changed from {} to {}; the LR schedule follows the new total", saved.total_steps,
             ts.total_steps);
  load_checkpoint_weights(ckpt, ms.model, ms.layout, master_sink(st), master_pieces(st), nullptr);
  load_optimizer(ckpt / "trainer_state" / "optimizer.bin");
  ts.global_step = saved.global_step;
  ts.micro_batches_done = saved.micro_batches_done;
  ts.losses = saved.losses;
  ts.skipped_steps = saved.skipped_steps;
  ts.nonfinite_loss_steps = saved.nonfinite_loss_steps;
  ts.data_epoch = saved.data_epoch;
  ts.data_index = saved.data_index;
  // The model the run started from (a resumed run's model config is read from the checkpoint directory).
  if (!saved.model_name.empty()) ts.model_name = saved.model_name;
  loader.restore({saved.data_epoch, saved.data_index});
  std::printf("resumed from %s at step %lld\n", ckpt.string().c_str(), (long long)ts.global_step);
  if (ts.global_step >= ts.total_steps) std::printf("%s\n", nothing_to_do_message(ckpt, cfg.schedule, ts).c_str());
}

std::string nothing_to_do_message(const fs::path& ckpt, const ScheduleSection& cfg, const TrainerState& ts) {
  const std::string name = ckpt.filename().string();
  const auto step = (long long)ts.global_step, total = (long long)ts.total_steps;
  if (cfg.max_steps > 0)
    return step == total ? fmt::format("nothing to do: {} is at step {} = max_steps; raise max_steps to train further",
                                       name, step)
                         : fmt::format("nothing to do: {} is at step {}, past max_steps = {}; raise max_steps above {} "
                                       "to train further",
                                       name, step, total, step);
  return fmt::format("nothing to do: {} is at step {}, and num_train_epochs = {} makes {} steps; raise "
                     "num_train_epochs or set max_steps above {} to train further",
                     name, step, cfg.num_train_epochs, total, step);
}

std::string resume_command(const TrainConfig& cfg) {
  std::string cmd = "lazytrain train " + (cfg.config_path.empty() ? std::string("<config.yaml>") : cfg.config_path.string());
  for (const auto& ov : cfg.overrides)
    if (ov.rfind("resume_from_checkpoint=", 0) != 0) cmd += " " + ov;
  return cmd + " resume_from_checkpoint=auto";
}

StepMetrics step_metrics(const TrainerState& ts, const StepShape& shape, const StepFigures& f, const FlopModel& flops,
                         double peak, bool gpu, const TrainingPlan& tp) {
  const StepResult& r = *f.r;
  StepMetrics m;
  m.step = ts.global_step;
  m.total_steps = shape.total_steps;
  m.epoch = double(ts.micro_batches_done) / double(shape.batches_per_epoch);
  m.loss = r.loss;
  m.grad_norm = f.grad_norm;
  m.lr = f.lr;
  m.step_time = f.step_time;
  m.tokens = r.rows;
  m.nonpad_tokens = f.nonpad;
  m.loss_tokens = r.n_tokens;
  FlopModel step_flops = flops;
  if (f.model_flops_attn >= 0) step_flops.model_flops_attn = f.model_flops_attn;
  fill_throughput(m, step_flops, peak);
  m.peak_gpu_bytes = gpu ? r.peak_device : -1;
  m.host_rss_bytes = host_peak_rss_bytes();
  m.exposed_transfer_s = std::max(0.0, r.exposed_s - r.exposed_optimizer_s);
  m.exposed_transfer_pred_s = tp.predicted_exposed_transfer_s;  // the planner's split (the windows' include waits)
  m.exposed_optimizer_s = r.exposed_optimizer_s;
  m.exposed_optimizer_pred_s = tp.predicted_exposed_optimizer_s;
  m.optimizer_wait_s = r.update_wait_s;
  m.breakdown = step_breakdown(r, shape.rank_ga, f.step_time, tp.predicted_step_s, tp.predicted_exposed_transfer_s,
                               tp.predicted_exposed_optimizer_s);
  return m;
}

void final_evaluation(const TrainConfig& cfg, const TrainHooks& hooks, const ModelSetup& ms,
                      const data::PreparedData& data, HostState& st, Backend& be, bool gpu,
                      std::unique_ptr<Executor>& executor, MetricsLogger& logger, int64_t step, TrainResult& result) {
  data::ReadOptions ro;
  ro.max_samples = cfg.eval.eval_max_samples;
  ro.seed = uint64_t(cfg.schedule.seed) + 7;
  auto records = data::load_records(cfg.eval.do_eval_dataset, ro);
  ModelWeightsView v{&ms.model, &ms.layout, {}};
  // The decoder reads fp32 units: the master itself where it is an fp32 array, else a rebuilt copy.
  std::vector<std::vector<float>> rebuilt;
  for (int64_t u = 0; u < st.units(); ++u) {
    if (st.storage() == MasterStorage::Aliased || st.storage() == MasterStorage::F32Copy) {
      v.units.push_back(st.master(u));
      continue;
    }
    rebuilt.emplace_back(size_t(st.numel(u)));
    st.read_master(u, rebuilt.back().data());
    v.units.push_back(rebuilt.back().data());
  }
  EvalOptions eopt;
  eopt.batch_size = cfg.eval.per_device_eval_batch_size > 0 ? cfg.eval.per_device_eval_batch_size : 64;
  eopt.max_new_tokens = cfg.eval.max_new_tokens;
  eopt.output_jsonl = (fs::path(cfg.output.output_dir) / "eval_results.jsonl").string();
  const int64_t longest_prompt = longest_prompt_tokens(data.tmpl, records);
  check_fits_max_position(ms.model, longest_prompt, eopt.max_new_tokens, "config: max_new_tokens");
  std::unique_ptr<Generator> gen;
  const bool gpu_eval = gpu && hooks.gpu_decode.built() && !records.empty();
  const std::string gpu_why = gpu_eval ? hooks.gpu_decode.unsupported_reason(ms.model) : std::string();
  if (!gpu_why.empty()) log_info("evaluation decodes on the CPU: {}", gpu_why);
  if (gpu_eval && gpu_why.empty()) {
    // Decode on the GPU that trained: the executor's device buffers go back to the backend's arena,
    // from which the decoder takes its weights, KV cache and workspace.
    be.synchronize();
    executor.reset();
    DecodeDeviceOptions dopt;
    dopt.device = DecodeDevice::Cuda;
    dopt.size_for(eopt.batch_size, int64_t(records.size()), longest_prompt, eopt.max_new_tokens);
    gen = make_generator(v, dopt, hooks.gpu_decode, &be);
  } else {
    gen = make_cpu_generator(v);
  }
  EvalResult er = evaluate_exact_match(*gen, data.tmpl, records, eopt);
  result.exact_match = er.exact_match;
  result.eval_samples = er.samples;
  std::printf("eval: exact match %.2f%% (%lld/%lld) on %s in %.1f s; per-sample results in %s\n",
              100.0 * er.exact_match, (long long)er.correct, (long long)er.samples, cfg.eval.do_eval_dataset.c_str(),
              er.seconds, eopt.output_jsonl.c_str());
  std::printf("%s\n", format_decode_stats(gen->describe(), gen->stats()).c_str());
  logger.event(nlohmann::json{{"type", "exact_match"},
                              {"step", step},
                              {"dataset", cfg.eval.do_eval_dataset},
                              {"exact_match", er.exact_match},
                              {"correct", er.correct},
                              {"samples", er.samples},
                              {"seconds", er.seconds}}
                   .dump());
}

}  // namespace lt::train
