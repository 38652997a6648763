#include "train/trainer.h"

#include <omp.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/units.h"
#include "data/batch.h"
#include "data/prepare.h"
#include "exec/executor.h"
#include "exec/optim_hook.h"
#include "io/model_io.h"
#include "model/init.h"
#include "train/checkpoint.h"
#include "train/checkpoint_dir.h"
#include "train/evaluate.h"
#include "train/lr_schedule.h"
#include "train/model_setup.h"
#include "train/planning.h"
#include "train/signals.h"

extern "C" void openblas_set_num_threads(int);

namespace lt::train {
namespace {

MicroBatch micro_batch_of(const data::Batch& b, std::vector<int32_t>& targets_storage, bool packed) {
  targets_storage.resize(b.input_ids.size());
  cpu::SeqGeometry g = b.geometry();
  cpu::shift_labels(b.labels.data(), g, targets_storage.data());
  MicroBatch mb;
  mb.ids = b.input_ids.data();
  mb.targets = targets_storage.data();
  // Without packing every row is one sample from position 0 (padding only at the end, which causal
  // attention never lets a real token see), so the default geometry is exact and cheaper.
  mb.positions = packed ? b.positions.data() : nullptr;
  mb.segments = packed ? b.segments.data() : nullptr;
  return mb;
}

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

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

BackendChoice make_cpu_backend(const ModelConfig& m, const TrainConfig& c, int64_t device_budget, int64_t host_budget) {
  (void)host_budget;
  LT_CHECK(c.backend != "cuda", "backend: 'cuda' requested but this lazytrain was built without the CUDA backend");
  CpuBackendOptions o;
  o.device_budget = device_budget;
  BackendChoice b;
  b.backend = std::make_unique<CpuBackend>(m, o);
  b.device_name = "cpu";
  b.gpu = false;
  return b;
}

TrainResult run_training(const TrainConfig& cfg, const TrainHooks& hooks) {
  TrainResult result;
  if (cfg.threads > 0) {
    openblas_set_num_threads(int(cfg.threads));
    omp_set_num_threads(int(cfg.threads));
  }
  const fs::path out = cfg.output_dir;

  // ---- where we start from ----
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

  // ---- tokenizer, model, data ----
  ModelSetup ms = setup_model(cfg, resume);
  data::DataConfig dc;
  dc.dataset = cfg.dataset;
  dc.eval_dataset = cfg.eval_dataset;
  dc.template_name = cfg.template_name;
  dc.format = cfg.dataset_format;
  dc.on_malformed = cfg.on_malformed;
  dc.overlong = cfg.overlong;
  dc.cutoff_len = cfg.cutoff_len;
  dc.train_on_inputs = cfg.train_on_inputs;
  dc.val_size = cfg.val_size;
  dc.max_samples = cfg.max_samples;
  dc.seed = uint64_t(cfg.seed);
  data::PreparedData data = data::prepare_data(dc, ms.tokenizer);
  LT_CHECK(!data.train.empty(), "dataset '{}': no training samples left after tokenisation", cfg.dataset);
  for (const auto& s : data.train)
    for (int32_t id : s.ids)
      LT_CHECK(id >= 0 && id < ms.model.vocab, "token id {} is outside the model's vocabulary ({}): tokenizer and model do not match",
               id, ms.model.vocab);

  // Fixed micro-batch shape: packing fills cutoff_len; padding needs only the longest sample.
  int64_t longest = 0;
  for (const auto& s : data.train) longest = std::max<int64_t>(longest, int64_t(s.ids.size()));
  for (const auto& s : data.val) longest = std::max<int64_t>(longest, int64_t(s.ids.size()));
  const int64_t seq = cfg.packing ? cfg.cutoff_len : std::min(cfg.cutoff_len, round_up(longest, 8));
  const int64_t batch = cfg.per_device_train_batch_size;
  const int64_t ga = cfg.gradient_accumulation_steps;
  data::LoaderOptions lo;
  lo.batch = batch;
  lo.seq = seq;
  lo.packing = cfg.packing;
  lo.shuffle = true;
  lo.seed = uint64_t(cfg.seed);
  lo.pad_id = data.tmpl.pad_id();
  data::DataLoader loader(&data.train, lo);
  const int64_t batches_per_epoch = loader.batches_per_epoch();
  const int64_t updates_per_epoch = std::max<int64_t>(1, batches_per_epoch / ga);
  const int64_t total_steps = cfg.max_steps > 0
                                  ? cfg.max_steps
                                  : std::max<int64_t>(1, int64_t(std::ceil(cfg.num_train_epochs * double(updates_per_epoch))));
  LrSchedule sched{cfg.lr_scheduler_type, cfg.learning_rate,
                   resolve_warmup_steps(cfg.warmup_steps, cfg.warmup_ratio, total_steps), total_steps,
                   cfg.min_lr_ratio};

  // ---- plan, backend, state ----
  BackendFactory factory = hooks.make_backend ? hooks.make_backend : BackendFactory(make_cpu_backend);
  const int64_t dev_budget = cfg.gpu_mem.empty() ? -1 : parse_bytes(cfg.gpu_mem);
  const int64_t host_budget = cfg.host_mem.empty() ? -1 : parse_bytes(cfg.host_mem);
  const DeviceProbe probe = hooks.probe_device ? hooks.probe_device(cfg) : DeviceProbe{};
  TrainingPlan tp = make_training_plan(cfg, ms.model, batch, seq, probe.name, probe.gpu);
  BackendChoice bc = factory(ms.model, cfg, dev_budget, host_budget);
  LT_CHECK(bc.gpu == probe.gpu, "internal: device probe said {} but the backend is {}", probe.name, bc.backend->name());
  Backend& be = *bc.backend;
  std::printf("%s", tp.summary.c_str());
  std::printf("training: %s on %s | %lld samples, seq %lld, batch %lld x %lld accumulation | %lld steps "
              "(%lld per epoch) | %s %s, lr %.3g %s, warmup %lld\n",
              ms.model.name.c_str(), be.name().c_str(), (long long)data.train.size(), (long long)seq,
              (long long)batch, (long long)ga, (long long)total_steps, (long long)updates_per_epoch,
              cfg.optimizer.c_str(), tp.tensors_8bit.empty() ? "" : fmt::format("({} tensors 8-bit)", tp.tensors_8bit.size()).c_str(),
              cfg.learning_rate, cfg.lr_scheduler_type.c_str(), (long long)sched.warmup_steps);
  std::fflush(stdout);

  HostState st(be);
  for (int64_t u = 0; u < st.units(); ++u) {
    LT_CHECK(st.numel(u) == ms.layout.units[size_t(u)].numel, "internal: unit {} size mismatch", u);
    std::copy(ms.initial.units[size_t(u)].begin(), ms.initial.units[size_t(u)].end(), st.master(u));
  }
  ms.initial.units.clear();  // the host state owns the weights from here

  OptimizerSetup os;
  os.weight_decay = float(cfg.weight_decay);
  os.beta1 = float(cfg.adam_beta1);
  os.beta2 = float(cfg.adam_beta2);
  os.eps = float(cfg.adam_epsilon);
  os.max_grad_norm = float(cfg.max_grad_norm);
  os.kind = optim::parse_optimizer_kind(cfg.optimizer);
  os.tensors_8bit = tp.tensors_8bit;
  // On the CPU backend the compute lane needs the cores; one optimizer thread overlaps with it.
  os.threads = bc.gpu ? int(cfg.threads) : 1;
  AdamWHook hook(ms.layout, st, os);

  TrainerState ts;
  ts.batches_per_epoch = batches_per_epoch;
  ts.total_steps = total_steps;
  ts.seed = uint64_t(cfg.seed);
  ts.lr_scheduler_type = cfg.lr_scheduler_type;
  ts.base_lr = cfg.learning_rate;
  ts.warmup_steps = sched.warmup_steps;
  ts.optimizer = cfg.optimizer;
  ts.tensors_8bit.assign(tp.tensors_8bit.begin(), tp.tensors_8bit.end());
  ts.model_name = ms.model.name;
  if (resume) {
    TrainerState saved = read_trainer_state(*resume);
    LT_CHECK(saved.batches_per_epoch == batches_per_epoch,
             "resume: checkpoint '{}' was made with {} micro-batches per epoch, this run has {} (dataset, "
             "batch size, cutoff_len or packing changed)",
             resume->string(), saved.batches_per_epoch, batches_per_epoch);
    LT_CHECK(saved.optimizer == cfg.optimizer, "resume: checkpoint '{}' used optimizer '{}', the config says '{}'",
             resume->string(), saved.optimizer, cfg.optimizer);
    if (saved.total_steps != total_steps)
      log_warn("resume: total steps changed from {} to {}; the LR schedule follows the new total", saved.total_steps,
               total_steps);
    std::vector<float*> masters;
    for (int64_t u = 0; u < st.units(); ++u) masters.push_back(st.master(u));
    load_checkpoint_weights(*resume, ms.model, ms.layout, masters, &hook.optimizer());
    ts.global_step = saved.global_step;
    ts.micro_batches_done = saved.micro_batches_done;
    ts.losses = saved.losses;
    ts.data_epoch = saved.data_epoch;
    ts.data_index = saved.data_index;
    loader.restore({saved.data_epoch, saved.data_index});
    std::printf("resumed from %s at step %lld\n", resume->string().c_str(), (long long)ts.global_step);
  }
  st.refresh_all_streams();

  ExecOptions eo;
  eo.nvme_dir = cfg.nvme_dir.empty() ? fs::path() : fs::path(cfg.nvme_dir);
  eo.timing = true;
  auto executor = std::make_unique<Executor>(ms.model, be, tp.exec, st, eo);
  Executor& ex = *executor;
  ex.set_update_hook(&hook);

  // ---- bookkeeping ----
  MetricsLogger logger(out / "metrics.jsonl", cfg.progress_bar, bool(resume));
  const double peak = cfg.peak_tflops > 0 ? cfg.peak_tflops : device_peak_tflops(bc.device_name);
  const FlopModel flops = flop_model(ms.model, batch, seq, ga, tp.extra_layer_forwards);
  std::unique_ptr<StopSignals> signals;
  if (hooks.install_signal_handlers) signals = std::make_unique<StopSignals>();
  const std::string config_yaml = config_to_yaml(cfg);
  auto save = [&]() {
    hook.wait_all();
    CheckpointContents cc;
    cc.model = &ms.model;
    cc.layout = &ms.layout;
    for (int64_t u = 0; u < st.units(); ++u) cc.masters.push_back(st.master(u));
    cc.optimizer = &hook.optimizer();
    cc.state = ts;
    cc.config_yaml = config_yaml;
    cc.tokenizer_dir = ms.tokenizer_dir;
    // The newest checkpoint holds the pass-through tensors too (and survives rotation, unlike older ones).
    cc.passthrough_from = result.last_checkpoint.empty() ? ms.weights_source : result.last_checkpoint;
    cc.save_fp32_model = cfg.save_dtype == "fp32";
    double t0 = now_seconds();
    fs::path p = save_checkpoint(out, cc, cfg.save_total_limit);
    result.last_checkpoint = p;
    logger.message(fmt::format("saved checkpoint {} ({:.2f} s; model weights {}, trainer state fp32)", p.string(),
                               now_seconds() - t0, cfg.save_dtype));
    logger.event(nlohmann::json{{"type", "checkpoint"}, {"step", ts.global_step}, {"path", p.string()}}.dump());
  };
  std::vector<data::Batch> val_batches;
  if (cfg.eval_steps > 0 && !data.val.empty())
    val_batches = data::make_batches(data.val, batch, seq, cfg.packing, data.tmpl.pad_id());
  auto eval_loss = [&]() {
    hook.wait_all();
    double sum = 0;
    int64_t n = 0;
    std::vector<int32_t> tgt;
    for (const auto& b : val_batches) {
      int64_t k = 0;
      double l = ex.eval_loss(micro_batch_of(b, tgt, cfg.packing), &k);
      sum += l * double(k);
      n += k;
    }
    double loss = n ? sum / double(n) : 0.0;
    logger.message(fmt::format("eval step {} | eval_loss {:.4f} over {} tokens", ts.global_step, loss, n));
    logger.event(nlohmann::json{{"type", "eval"}, {"step", ts.global_step}, {"eval_loss", loss}, {"tokens", n}}.dump());
  };

  // ---- the loop ----
  const double t_start = now_seconds();
  int64_t steps_this_run = 0;
  bool saved_at_current = false;
  std::vector<data::Batch> batches(static_cast<size_t>(ga));
  std::vector<std::vector<int32_t>> targets(static_cast<size_t>(ga));
  while (ts.global_step < total_steps) {
    const double t0 = now_seconds();
    std::vector<MicroBatch> mbs;
    int64_t nonpad = 0;
    for (int64_t i = 0; i < ga; ++i) {
      batches[size_t(i)] = loader.next();
      nonpad += batches[size_t(i)].n_real_tokens;
      mbs.push_back(micro_batch_of(batches[size_t(i)], targets[size_t(i)], cfg.packing));
    }
    const double lr = sched.lr(ts.global_step);
    hook.begin_step(float(lr));
    StepResult r = ex.train_step(mbs);
    LT_CHECK(hook.optimizer().norm_known(), "internal: step {} ended without every unit's gradient reported",
             ts.global_step + 1);
    const optim::StepInfo info = hook.optimizer().last_step();
    const double dt = now_seconds() - t0;

    ts.global_step++;
    ts.micro_batches_done += ga;
    ts.last_lr = lr;
    ts.losses.push_back(r.loss);
    auto pos = loader.position();
    ts.data_epoch = pos.epoch;
    ts.data_index = pos.index;
    steps_this_run++;
    saved_at_current = false;
    // --trace: one step as a Chrome/Perfetto trace (a later step than the first, which warms up).
    if (!cfg.trace.empty() && (ts.global_step == cfg.trace_step ||
                               (ts.global_step == total_steps && total_steps < cfg.trace_step))) {
      ex.write_trace(cfg.trace);
      logger.message(fmt::format("step {}: trace written to {} (open in chrome://tracing or ui.perfetto.dev)",
                                 ts.global_step, cfg.trace));
    }
    if (info.skipped) logger.message(fmt::format("step {}: non-finite gradient norm, update skipped", ts.global_step));

    StepMetrics m;
    m.step = ts.global_step;
    m.total_steps = total_steps;
    m.epoch = double(ts.micro_batches_done) / double(batches_per_epoch);
    m.loss = r.loss;
    m.grad_norm = info.grad_norm;
    m.lr = lr;
    m.step_time = dt;
    m.tokens = r.rows;
    m.nonpad_tokens = nonpad;
    m.loss_tokens = r.n_tokens;
    fill_throughput(m, flops, peak);
    m.peak_gpu_bytes = bc.gpu ? r.peak_device : -1;
    m.host_rss_bytes = host_peak_rss_bytes();
    m.exposed_transfer_s = std::max(0.0, r.exposed_s - r.exposed_optimizer_s);
    m.exposed_transfer_pred_s = tp.predicted_exposed_transfer_s;  // the planner's split (the windows' include waits)
    m.exposed_optimizer_s = r.exposed_optimizer_s;
    m.exposed_optimizer_pred_s = tp.predicted_exposed_optimizer_s;
    m.optimizer_wait_s = r.update_wait_s;
    if (hooks.on_step) hooks.on_step(m);
    if (ts.global_step % cfg.logging_steps == 0 || ts.global_step == total_steps || ts.global_step == 1)
      logger.log(m);
    else
      logger.event(to_json_line(m));
    logger.progress(ts.global_step, total_steps, r.loss);

    if (cfg.eval_steps > 0 && !val_batches.empty() && ts.global_step % cfg.eval_steps == 0) eval_loss();
    bool stop = StopSignals::requested() || (hooks.stop_after_steps >= 0 && steps_this_run >= hooks.stop_after_steps);
    if ((cfg.save_steps > 0 && ts.global_step % cfg.save_steps == 0) || stop) {
      save();
      saved_at_current = true;
    }
    if (stop) {
      int sig = StopSignals::signal_number();
      std::string cmd = "lazytrain train " + (cfg.config_path.empty() ? std::string("<config.yaml>") : cfg.config_path.string());
      for (const auto& ov : cfg.overrides)
        if (ov.rfind("resume_from_checkpoint=", 0) != 0) cmd += " " + ov;
      logger.message(fmt::format("training stopped{} after step {}/{}; checkpoint saved to {}.\nResume with: {} "
                                 "resume_from_checkpoint=auto",
                                 sig == SIGINT ? " by SIGINT" : sig == SIGTERM ? " by SIGTERM" : "", ts.global_step,
                                 total_steps, result.last_checkpoint.string(), cmd));
      result.interrupted = true;
      break;
    }
  }
  hook.wait_all();
  logger.finish();
  if (!result.interrupted && cfg.save_final && !saved_at_current && steps_this_run > 0) save();
  result.train_seconds = now_seconds() - t_start;
  result.global_step = ts.global_step;
  result.total_steps = total_steps;
  result.losses = ts.losses;
  if (!result.interrupted && steps_this_run > 0)
    std::printf("training done: %lld steps in %.1f s, final loss %.4f\n", (long long)ts.global_step,
                result.train_seconds, ts.losses.empty() ? 0.0 : ts.losses.back());

  // ---- exact-match evaluation on held-out data ----
  if (!result.interrupted && !cfg.do_eval_dataset.empty()) {
    data::ReadOptions ro;
    ro.max_samples = cfg.eval_max_samples;
    ro.seed = uint64_t(cfg.seed) + 7;
    auto records = data::load_records(cfg.do_eval_dataset, ro);
    ModelWeightsView v{&ms.model, &ms.layout, {}};
    for (int64_t u = 0; u < st.units(); ++u) v.units.push_back(st.master(u));
    EvalOptions eopt;
    eopt.batch_size = cfg.per_device_eval_batch_size > 0 ? cfg.per_device_eval_batch_size : 64;
    eopt.max_new_tokens = cfg.max_new_tokens;
    eopt.output_jsonl = (out / "eval_results.jsonl").string();
    std::unique_ptr<Generator> gen;
    const bool gpu_eval = bc.gpu && hooks.gpu_decode.built() && !records.empty();
    const std::string gpu_why = gpu_eval ? hooks.gpu_decode.unsupported_reason(ms.model) : std::string();
    if (!gpu_why.empty()) log_info("evaluation decodes on the CPU: {}", gpu_why);
    if (gpu_eval && gpu_why.empty()) {
      // Decode on the GPU that trained: the executor's device buffers go back to the backend's arena,
      // from which the decoder takes its weights, KV cache and workspace.
      be.synchronize();
      executor.reset();
      DecodeDeviceOptions dopt;
      dopt.device = DecodeDevice::Cuda;
      dopt.size_for(eopt.batch_size, int64_t(records.size()), longest_prompt_tokens(data.tmpl, records),
                    eopt.max_new_tokens);
      gen = make_generator(v, dopt, hooks.gpu_decode, &be);
    } else {
      gen = make_cpu_generator(v);
    }
    EvalResult er = evaluate_exact_match(*gen, data.tmpl, records, eopt);
    result.exact_match = er.exact_match;
    result.eval_samples = er.samples;
    std::printf("eval: exact match %.2f%% (%lld/%lld) on %s in %.1f s; per-sample results in %s\n",
                100.0 * er.exact_match, (long long)er.correct, (long long)er.samples, cfg.do_eval_dataset.c_str(),
                er.seconds, eopt.output_jsonl.c_str());
    std::printf("%s\n", format_decode_stats(gen->describe(), gen->stats()).c_str());
    logger.event(nlohmann::json{{"type", "exact_match"},
                                {"step", ts.global_step},
                                {"dataset", cfg.do_eval_dataset},
                                {"exact_match", er.exact_match},
                                {"correct", er.correct},
                                {"samples", er.samples},
                                {"seconds", er.seconds}}
                     .dump());
  }
  return result;
}

}  // namespace lt::train
