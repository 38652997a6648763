#include "train/trainer.h"

#include <omp.h>

#include <optional>
#include <algorithm>
#include <thread>
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
#include "infer/evaluate.h"
#include "io/model_io.h"
#include "model/accounting.h"
#include "model/init.h"
#include "model/sequence.h"
#include "nvme/nvme_store.h"
#include "train/checkpoint.h"
#include "train/checkpoint_dir.h"
#include "train/data_parallel.h"
#include "train/lr_schedule.h"
#include "train/model_setup.h"
#include "train/nonfinite.h"
#include "train/nvme_space.h"
#include "train/planning.h"
#include "train/signals.h"
#include "train/trainer_setup.h"

extern "C" void openblas_set_num_threads(int);

namespace lt::train {
namespace {

MicroBatch micro_batch_of(const data::Batch& b, std::vector<int32_t>& targets_storage, bool packed) {
  targets_storage.resize(b.input_ids.size());
  SeqGeometry g = b.geometry();
  shift_labels(b.labels.data(), g, targets_storage.data());
  MicroBatch mb;
  mb.ids = b.input_ids.data();
  mb.targets = targets_storage.data();
  // Without packing every row is one sample from position 0 (padding only at the end, which causal
  // attention never lets a real token see), so the default geometry is exact and cheaper.
  mb.positions = packed ? b.positions.data() : nullptr;
  mb.segments = packed ? b.segments.data() : nullptr;
  return mb;
}

// Adds a micro-batch's rows with the segments the executor masks (micro_batch_of: packed rows' ids; else
// each row is one segment, padding included).
void add_rows(StepRows& rows, const data::Batch& b, bool packed) {
  for (int64_t i = 0; i < b.batch; ++i) add_row(rows, packed ? b.segments.data() + i * b.seq : nullptr, b.seq);
}

}  // namespace

BackendChoice make_cpu_backend(const ModelConfig& m, const TrainConfig& c, int64_t device_budget, int64_t host_budget) {
  (void)host_budget;
  LT_CHECK(c.placement.backend != BackendKind::Cuda,
           "backend: 'cuda' requested but this lazytrain was built without the CUDA backend");
  CpuBackendOptions o;
  o.device_budget = device_budget;
  BackendChoice b;
  b.backend = std::make_unique<CpuBackend>(m, o);
  b.device_name = "cpu";
  b.gpu = false;
  return b;
}

namespace {

// Under `lazytrain launch -n N` (N > 1) this process is one rank of a data-parallel run.
std::unique_ptr<DataParallel> make_data_parallel(const TrainConfig& cfg, const TrainHooks& hooks) {
  const dist::DistEnv env = dist::dist_env_from_environment();
  if (!env.launched || env.world == 1) return nullptr;
  return std::make_unique<DataParallel>(env, cfg, hooks.make_communicator);
}

// One run of `lazytrain train`: set up in the constructor (output dir, model, data, plan, backend,
// host state, optimizer, executor), then run() — the step loop, the final save and evaluation.
// Data parallel (dp_): each rank runs its share of every global batch; rank 0 alone writes output.
class TrainSession {
 public:
  TrainSession(const TrainConfig& cfg, const TrainHooks& hooks)
      : cfg_(cfg),
        hooks_(hooks),
        out_(cfg.output.output_dir),
        dp_(make_data_parallel(cfg, hooks)),
        leader_(!dp_ || dp_->leader()),
        resume_(dp_ ? dp_->prepare_output_dir(cfg.output, output_lock_) : prepare_output_dir(cfg.output, output_lock_)),
        ms_(setup_model(cfg, resume_)),
        data_(load_training_data(cfg, ms_)),
        loader_(&data_.train, loader_options(cfg, sequence_length(cfg.data, data_), data_.tmpl.pad_id())),
        shape_(step_shape(cfg.schedule, sequence_length(cfg.data, data_), loader_.batches_per_epoch(),
                          dp_ ? dp_->world() : 1)),
        probe_(hooks.probe_device ? hooks.probe_device(cfg) : DeviceProbe{}),
        tp_(make_training_plan(dp_ ? dp_->planning_config(cfg) : cfg, ms_.model, shape_.batch, shape_.seq,
                               probe_.name, probe_.gpu, dp_ ? rank_topology(dp_->world()) : dist::Topology{},
                               sampled_attention_fraction(data_.train, loader_options(cfg, shape_.seq,
                                                                                      data_.tmpl.pad_id())))),
        bc_(make_backend()),
        st_(*bc_.backend, state_options()),
        hook_(make_update_hook()),
        ts_(initial_trainer_state(cfg, shape_, tp_, ms_)),
        logger_(leader_ ? out_ / "metrics.jsonl" : fs::path(), cfg.output.progress_bar && leader_, bool(resume_)),
        flops_(flop_model(ms_.model, shape_.batch, shape_.seq, shape_.ga, tp_.extra_layer_forwards)),
        peak_(cfg.output.peak_tflops > 0 ? cfg.output.peak_tflops : device_peak_tflops(bc_.device_name)),
        config_yaml_(config_to_yaml(cfg)) {
    if (!leader_) logger_.mute_console();
    if (leader_) print_summary();
    check_nvme_space(cfg.placement.nvme_dir, nvme_need());
    if (resume_)
      resume_from(*resume_, cfg_, ms_, st_, optimizer(), [this](const fs::path& f) { load_optimizer(f); }, loader_,
                  ts_);
    st_.refresh_all_streams();
    ExecOptions eo;
    eo.nvme_dir = cfg.placement.nvme_dir.empty() ? fs::path() : fs::path(cfg.placement.nvme_dir);
    if (!eo.nvme_dir.empty()) eo.io = default_io(tp_.nvme_queue);
    eo.timing = true;
    eo.micro_batches = int32_t(shape_.rank_ga);
    executor_ = std::make_unique<Executor>(ms_.model, *bc_.backend, tp_.exec, st_, eo);
    executor_->set_update_hook(dp_ ? &dp_->hook() : static_cast<UpdateHook*>(hook_.get()));
    // One process installs the handlers in run_training, before the setup; a data-parallel rank here, once set up
    // (its ranks agree after each step whether to stop).
    if (hooks.install_signal_handlers && dp_) signals_ = std::make_unique<StopSignals>();
    if (cfg.eval.eval_steps > 0 && !data_.val.empty())
      val_batches_ = data::make_batches(data_.val, shape_.batch, shape_.seq, cfg.data.packing, data_.tmpl.pad_id());
  }

  TrainResult run() {
    try {
      return run_steps();
    } catch (const NonFiniteStopped&) {
      throw;  // every rank stops after the same step
    } catch (const std::exception& e) {
      if (dp_) dp_->comm().abort(e.what());  // the other ranks stop now, with this message
      throw;
    }
  }

 private:
  TrainResult run_steps() {
    const double t_start = now_seconds();
    while (ts_.global_step < shape_.total_steps)
      if (!step()) break;
    wait_updates();
    logger_.finish();
    if (!result_.interrupted && streak_.length() > 0) stop_nonfinite(true);  // no final save of that state
    if (!result_.interrupted && cfg_.output.save_final && !saved_at_current_ && steps_this_run_ > 0) save();
    result_.train_seconds = now_seconds() - t_start;
    result_.global_step = ts_.global_step;
    result_.total_steps = shape_.total_steps;
    result_.losses = ts_.losses;
    result_.skipped_steps = ts_.skipped_steps;
    result_.nonfinite_loss_steps = ts_.nonfinite_loss_steps;
    if (!result_.interrupted && steps_this_run_ > 0 && leader_)
      std::printf("training done: %lld steps in %.1f s, final loss %.4f%s\n", (long long)ts_.global_step,
                  result_.train_seconds, ts_.losses.empty() ? 0.0 : ts_.losses.back(), skipped_summary().c_str());
    if (!result_.interrupted && !cfg_.eval.do_eval_dataset.empty() && leader_)
      final_evaluation(cfg_, hooks_, ms_, data_, st_, *bc_.backend, bc_.gpu, executor_, logger_, ts_.global_step,
                       result_);
    return result_;
  }

  BackendChoice make_backend() {
    BackendFactory factory = hooks_.make_backend ? hooks_.make_backend : BackendFactory(make_cpu_backend);
    const int64_t dev_budget = cfg_.placement.gpu_mem.empty() ? -1 : parse_bytes(cfg_.placement.gpu_mem);
    const int64_t host_budget = cfg_.placement.host_mem.empty() ? -1 : parse_bytes(cfg_.placement.host_mem);
    if (dp_) {
      check_data_parallel_config(cfg_.placement, tp_, dp_->world());
      dp_->check_same_plan(tp_);
    }
    BackendChoice bc = factory(ms_.model, cfg_, dev_budget, host_budget);
    LT_CHECK(bc.gpu == probe_.gpu, "internal: device probe said {} but the backend is {}", probe_.name,
             bc.backend->name());
    return bc;
  }

  // Every update of the last step done (gradients held on the device are streamed to the optimizer first).
  void wait_updates() {
    executor_->flush_updates();
    if (dp_)
      dp_->wait_all();
    else
      hook_->wait_all();
  }

  HostStateOptions state_options() const {
    HostStateOptions o = host_state_options(tp_);
    if (dp_) o.fp32_master_array = dist::dp_host_state().fp32_master_array;
    return o;
  }

  // The single-process hook, or the data-parallel rank's shard optimizer (then null here).
  // One process: the optimizer first, then the starting weights, so that remainders kept in its NVMe images
  // (nvme_remainder_units) are written there and never held in DRAM.
  std::unique_ptr<AdamWHook> make_update_hook() {
    const OptimizerSetup os = optimizer_setup(cfg_, tp_, bc_.gpu);
    if (dp_) {
      load_weights_into(st_);
      dp_->attach(ms_.layout, st_, os);
      return nullptr;
    }
    auto hook = std::make_unique<AdamWHook>(ms_.layout, st_, os);
    load_weights_into(st_);
    return hook;
  }

  optim::CpuAdamW& optimizer() { return dp_ ? dp_->optimizer() : hook_->optimizer(); }

  // What the run writes under nvme_dir (train/nvme_space.h): the moments' files and the plan's NVMe checkpoints.
  NvmeNeed nvme_need() {
    NvmeNeed n;
    n.moment_files = optimizer().moment_homes().nvme;
    const auto& o = st_.options();
    n.checkpoints = executor_memory(ms_.model, tp_.exec, bc_.backend->dtypes(), 0,
                                    {.home = o.grads, .micro_batches = int32_t(shape_.rank_ga), .dtype = o.grad_dtype})
                        .nvme;
    n.resuming = bool(resume_);
    return n;
  }

  void load_optimizer(const fs::path& file) {
    if (dp_)
      dp_->load_optimizer(file);
    else
      hook_->optimizer().load(file);
  }

  HostState& load_weights_into(HostState& st) {
    write_initial_weights(ms_, st, int(cfg_.placement.threads));
    return st;
  }

  void print_summary() const {
    std::printf("%s", tp_.summary.c_str());
    std::printf("%s", tp_.state_table.c_str());
    std::printf("training: %s on %s | %lld samples, seq %lld, %s | %lld steps "
                "(%lld per epoch) | %s %s, lr %.3g %s, warmup %lld\n",
                ms_.model.name.c_str(), bc_.backend->name().c_str(), (long long)data_.train.size(),
                (long long)shape_.seq, batch_description(shape_).c_str(), (long long)shape_.total_steps,
                (long long)shape_.updates_per_epoch, name_of(cfg_.optimizer.type),
                tp_.tensors_8bit.empty() ? "" : fmt::format("({} tensors 8-bit)", tp_.tensors_8bit.size()).c_str(),
                cfg_.schedule.learning_rate, name_of(cfg_.schedule.lr_scheduler_type),
                (long long)shape_.sched.warmup_steps);
    if (const std::string k = bc_.backend->describe_kernels(); !k.empty()) std::printf("%s\n", k.c_str());
    std::fflush(stdout);
  }

  void save() {
    if (dp_) {
      executor_->flush_updates();
      dp_->save([this](const std::function<void(const fs::path&)>& write_optimizer) { save_files(write_optimizer); });
      return;
    }
    wait_updates();
    save_files({});
  }

  // Writes the checkpoint (rank 0 of a data-parallel run; write_optimizer: its merged optimizer.bin).
  void save_files(const std::function<void(const fs::path&)>& write_optimizer) {
    CheckpointContents cc;
    cc.model = &ms_.model;
    cc.layout = &ms_.layout;
    cc.masters = [this](int64_t u, int64_t off, int64_t n, float* dst) { st_.read_master(u, off, n, dst); };
    cc.optimizer = &optimizer();
    cc.write_optimizer = write_optimizer;
    cc.state = ts_;
    cc.config_yaml = config_yaml_;
    cc.tokenizer_dir = ms_.tokenizer_dir;
    // The newest checkpoint holds the pass-through tensors too (and survives rotation, unlike older ones).
    cc.passthrough_from = result_.last_checkpoint.empty() ? ms_.weights_source : result_.last_checkpoint;
    cc.save_fp32_model = cfg_.output.save_dtype == SaveDtype::Fp32;
    const double t0 = now_seconds();
    fs::path p = save_checkpoint(out_, cc, cfg_.output.save_total_limit);
    result_.last_checkpoint = p;
    logger_.message(fmt::format("saved checkpoint {} ({:.2f} s; model weights {}, trainer state fp32)", p.string(),
                                now_seconds() - t0, name_of(cfg_.output.save_dtype)));
    logger_.event(nlohmann::json{{"type", "checkpoint"}, {"step", ts_.global_step}, {"path", p.string()}}.dump());
  }

  void eval_loss() {
    wait_updates();
    if (dp_)  // rank 0 evaluates alone, the others wait for it
      return dp_->on_leader([this] { eval_loss_here(); }, "evaluating");
    eval_loss_here();
  }

  void eval_loss_here() {
    double sum = 0;
    int64_t n = 0;
    std::vector<int32_t> tgt;
    for (const auto& b : val_batches_) {
      int64_t k = 0;
      const double l = executor_->eval_loss(micro_batch_of(b, tgt, cfg_.data.packing), &k);
      sum += l * double(k);
      n += k;
    }
    const double loss = n ? sum / double(n) : 0.0;
    logger_.message(fmt::format("eval step {} | eval_loss {:.4f} over {} tokens", ts_.global_step, loss, n));
    logger_.event(nlohmann::json{{"type", "eval"}, {"step", ts_.global_step}, {"eval_loss", loss}, {"tokens", n}}.dump());
  }

  // One optimizer step; false when a stop was requested (the checkpoint is saved first). Throws at the step that
  // makes max_skipped_steps in a row (0 or 1: the first) with a non-finite gradient norm or loss (no checkpoint of
  // that state).
  bool step() {
    if (hooks_.before_step) {
      wait_updates();
      hooks_.before_step(ts_.global_step + 1, st_, ms_.layout);
    }
    double t0 = now_seconds();
    const int64_t ga = shape_.ga;
    batches_.resize(size_t(ga));
    targets_.resize(size_t(ga));
    std::vector<MicroBatch> mbs;  // the global batch (a data-parallel rank runs its share)
    int64_t nonpad = 0;
    StepRows rows;
    for (int64_t i = 0; i < ga; ++i) {
      batches_[size_t(i)] = loader_.next();
      nonpad += batches_[size_t(i)].n_real_tokens;
      add_rows(rows, batches_[size_t(i)], cfg_.data.packing);
      mbs.push_back(micro_batch_of(batches_[size_t(i)], targets_[size_t(i)], cfg_.data.packing));
    }
    if (!geometry_prepared_) {  // one-time builds for the batch shape (cuDNN's graphs) outside the step's time
      const double p0 = now_seconds();
      executor_->prepare(mbs);
      geometry_prepared_ = true;
      t0 += now_seconds() - p0;
    }
    const double lr = shape_.sched.lr(ts_.global_step);
    const optim::UpdaterStats opt0 = optimizer().stats();
    // The rate's window starts at the previous step's start: that step's updates begin at its end and may finish
    // before this step starts (a small model), but always before this step's forward has run.
    const optim::UpdaterStats window0 = opt_prev_start_.value_or(opt0);
    opt_prev_start_ = opt0;
    StepResult r, local;
    const double comm0 = dp_ ? dp_->comm_seconds() : 0;
    optimizer().set_step_number(ts_.global_step + 1);  // its messages name the global step
    if (dp_) {
      r = dp_->step(*executor_, mbs, float(lr), &local);
    } else {
      // The next step's rows updated first.
      if (cfg_.placement.embedding_rows_first && executor_->wants_next_step_ids()) {
        std::vector<int32_t> next;
        for (const auto& b : loader_.peek(ga)) next.insert(next.end(), b.input_ids.begin(), b.input_ids.end());
        executor_->set_next_step_ids(std::move(next));
      }
      // A stop request between micro-batches ends the step there: the optimizer's step begins only at the last
      // micro-batch, so the state is still the previous step's, saved as such.
      StepCallbacks cb;
      cb.stop = [&](int64_t next) {
        return StopSignals::requested() ||
               (hooks_.stop_before_micro_batch && hooks_.stop_before_micro_batch(ts_.global_step + 1, next));
      };
      cb.before_last = [&] { hook_->begin_step(float(lr)); };
      try {
        r = executor_->train_step(mbs, 0, cb);
      } catch (const StepInterrupted& e) {
        stop_mid_step(e);
        return false;
      }
    }
    LT_CHECK(optimizer().norm_known(), "internal: step {} ended without every unit's gradient reported",
             ts_.global_step + 1);
    const optim::StepInfo info = optimizer().last_step();
    const double dt = now_seconds() - t0;
    advance_state(r, lr);
    if (leader_) write_trace_if_asked();
    const bool skipped = record_nonfinite(info, r.loss);
    if (!skipped) warn_if_extreme_gradients(info.grad_norm, r);
    StepMetrics m =
        step_metrics(ts_, shape_, StepFigures{&r, info.grad_norm, lr, dt, nonpad, model_flops_with_attention(ms_.model, rows)}, flops_, peak_, bc_.gpu, tp_);
    m.update_skipped = skipped;
    m.skipped_steps = ts_.skipped_steps;
    optimizer_rate(window0, m);
    if (dp_)
      m.ranks = dp_->gather(RankFigures{local.step_s, local.rows, local.n_tokens, host_peak_rss_bytes(),
                                        dp_->comm_seconds() - comm0});
    log_step(m);
    if (streak_.reached_limit()) stop_nonfinite(false);
    if (cfg_.eval.eval_steps > 0 && !val_batches_.empty() && ts_.global_step % cfg_.eval.eval_steps == 0) eval_loss();
    bool stop =
        StopSignals::requested() || (hooks_.stop_after_steps >= 0 && steps_this_run_ >= hooks_.stop_after_steps);
    if (dp_) stop = dp_->any(stop);  // every rank stops after the same step
    // A checkpoint is never made of the state after non-finite steps: the last good one stays the newest.
    const bool savable = streak_.length() == 0;
    if (((cfg_.output.save_steps > 0 && ts_.global_step % cfg_.output.save_steps == 0) || stop) && savable) {
      save();
      saved_at_current_ = true;
    }
    if (stop) report_stop(savable);
    return !stop;
  }

  // Gradients that are all exactly zero (with loss tokens and a finite loss) or finite but beyond any trained model's
  // (a norm above kExtremeGradNorm) mean broken weights that train silently: huge finite weights (a q_proj at 1e30
  // gave norms of 1e21-1e23 here, clipped every step, with a finite loss). Warned once a run, naming the largest
  // weight.
  static constexpr double kExtremeGradNorm = 1e6;
  void warn_if_extreme_gradients(double grad_norm, const StepResult& r) {
    if (extreme_gradients_warned_ || r.n_tokens <= 0 || !std::isfinite(r.loss) || !std::isfinite(grad_norm)) return;
    const bool zero = grad_norm == 0.0, huge = grad_norm > kExtremeGradNorm;
    if (!zero && !huge) return;
    extreme_gradients_warned_ = true;
    wait_updates();
    const LargestParameter big = largest_parameter(st_, ms_.layout, int(cfg_.placement.threads));
    const std::string largest = fmt::format("{} (|w| up to {:.3g})", big.name, double(big.max_abs));
    const std::string text =
        zero ? fmt::format("every gradient is exactly zero: the step carries no signal (all-zero weights or a saturated "
                           "softmax do this); the largest weight is {}", largest)
             : fmt::format("gradient norm {:.3g}, beyond any trained model's (clipped to {}); weights far outside a "
                           "trained model's range do this: the largest is {}",
                           grad_norm, cfg_.optimizer.max_grad_norm, largest);
    logger_.message(fmt::format("warning: step {}: {} (loss {:.4f}); check the model or checkpoint they were loaded from",
                                ts_.global_step, text, r.loss));
    logger_.event(nlohmann::json{{"type", "extreme_gradients"},
                                 {"step", ts_.global_step},
                                 {"grad_norm", grad_norm},
                                 {"largest_parameter", big.name},
                                 {"max_abs", big.max_abs}}
                      .dump());
  }

  // Whether the step was non-finite: the optimizer skipped its update for a non-finite gradient norm, or the loss is
  // non-finite (every rank agrees: the diagnosis below is collective); when it was, reports where the non-finite value
  // first appears. Returns whether the update was skipped.
  bool record_nonfinite(const optim::StepInfo& info, double loss) {
    const bool skipped = dp_ ? dp_->any(info.skipped) : info.skipped;
    const bool bad_loss = dp_ ? dp_->any(!std::isfinite(loss)) : !std::isfinite(loss);
    streak_.record(ts_.global_step, skipped || bad_loss, skipped);
    if (!skipped && !bad_loss) return false;
    ++(skipped ? ts_.skipped_steps : ts_.nonfinite_loss_steps);
    const NonFiniteStep s = diagnose(info.grad_norm, loss, skipped);
    if (streak_.length() == 1) streak_first_ = s;
    logger_.message(nonfinite_step_message(s, ms_.layout, streak_.length(), cfg_.schedule.max_skipped_steps));
    logger_.event(nlohmann::json{{"type", "nonfinite"},
                                 {"step", s.step},
                                 {"grad_norm", s.grad_norm},
                                 {"loss", s.loss},
                                 {"update_skipped", skipped},
                                 {"first_nonfinite", first_nonfinite_text(s, ms_.layout)},
                                 {"parameter", s.parameter ? s.parameter->name : ""},
                                 {"in_a_row", streak_.length()}}
                      .dump());
    return skipped;
  }

  // Where the step's non-finite value came from. The weights this step's forward read are the host masters once the
  // previous step's updates are done (a skipped step writes none; an applied one had finite gradients); scanned only
  // here, on failure.
  NonFiniteStep diagnose(double grad_norm, double loss, bool skipped) {
    wait_updates();
    NonFiniteStep s;
    s.step = ts_.global_step;
    s.grad_norm = grad_norm;
    s.loss = loss;
    s.skipped = skipped;
    s.parameter = first_nonfinite_parameter(st_, ms_.layout, int(cfg_.placement.threads));
    s.units = optimizer().nonfinite_units();
    return s;
  }

  // The checkpoint a run stopped by non-finite steps resumes from: this run's last, or the one it resumed from.
  fs::path last_good_checkpoint() const {
    if (!result_.last_checkpoint.empty()) return result_.last_checkpoint;
    return resume_ ? *resume_ : fs::path();
  }

  // Stops training with an lt::Error saying where the non-finite values first appeared and what to try; every rank
  // throws after the same step (their streaks are equal).
  [[noreturn]] void stop_nonfinite(bool run_ended) {
    NonFiniteStop s;
    s.step = ts_.global_step;
    s.first_step = streak_.first_step();
    s.max_skipped_steps = cfg_.schedule.max_skipped_steps;
    s.run_ended = run_ended;
    s.all_skipped = streak_.all_skipped();
    s.first_nonfinite = first_nonfinite_text(streak_first_, ms_.layout);
    s.in_weights = streak_first_.parameter.has_value();
    s.learning_rate = cfg_.schedule.learning_rate;
    s.gpu = bc_.gpu;
    const fs::path last = last_good_checkpoint();
    s.weights_source = resume_ ? resume_->string() : cfg_.model.name_or_path;
    s.last_checkpoint = last.string();
    // Resumed from it and non-finite from this run's first step on: its weights are the non-finite ones.
    s.checkpoint_has_them = resume_ && result_.last_checkpoint.empty() && streak_.length() == steps_this_run_;
    if (!last.empty()) s.resume_command = resume_with(last.string());
    logger_.event(nlohmann::json{{"type", "stopped"}, {"reason", "non-finite"}, {"step", s.step},
                                 {"first_step", s.first_step}, {"last_checkpoint", s.last_checkpoint}}
                      .dump());
    throw NonFiniteStopped(leader_ ? nonfinite_stop_message(s) : nonfinite_peer_stop_message(s));
  }

  // "; 2 steps skipped (non-finite gradient norm)" for the final summary, "" when every step was finite.
  std::string skipped_summary() const {
    const auto steps = [](int64_t n) { return n == 1 ? std::string("1 step") : fmt::format("{} steps", n); };
    std::string s;
    if (ts_.skipped_steps > 0) s += fmt::format("; {} skipped (non-finite gradient norm)", steps(ts_.skipped_steps));
    if (ts_.nonfinite_loss_steps > 0)
      s += fmt::format("; {} with a non-finite loss (update applied)", steps(ts_.nonfinite_loss_steps));
    return s;
  }

  // The CPU optimizer's achieved rate since `before` (its updates run beside the next step's forward).
  void optimizer_rate(const optim::UpdaterStats& before, StepMetrics& m) {
    const optim::UpdaterStats now = optimizer().stats();
    const int threads = optimizer().config().threads > 0 ? optimizer().config().threads
                                                         : int(std::max(1u, std::thread::hardware_concurrency()));
    const double busy = (now.busy_s - before.busy_s) / double(threads);
    if (busy > 0 && now.params_updated > before.params_updated)
      m.optimizer_params_per_s = double(now.params_updated - before.params_updated) / busy;
    m.optimizer_params_per_s_profile = tp_.predicted_optimizer_params_per_s;
  }

  void advance_state(const StepResult& r, double lr) {
    ts_.global_step++;
    ts_.micro_batches_done += shape_.ga;
    ts_.last_lr = lr;
    ts_.losses.push_back(r.loss);
    const auto pos = loader_.position();
    ts_.data_epoch = pos.epoch;
    ts_.data_index = pos.index;
    steps_this_run_++;
    saved_at_current_ = false;
  }

  // --trace: one step as a Chrome/Perfetto trace (a later step than the first, which warms up).
  void write_trace_if_asked() {
    if (cfg_.output.trace.empty()) return;
    if (ts_.global_step == cfg_.output.trace_step ||
        (ts_.global_step == shape_.total_steps && shape_.total_steps < cfg_.output.trace_step)) {
      executor_->write_trace(cfg_.output.trace);
      logger_.message(fmt::format("step {}: trace written to {} (open in chrome://tracing or ui.perfetto.dev)",
                                  ts_.global_step, cfg_.output.trace));
    }
  }

  void log_step(const StepMetrics& m) {
    if (hooks_.on_step) hooks_.on_step(m);
    const int64_t done = ts_.global_step;
    if (done % cfg_.output.logging_steps == 0 || done == shape_.total_steps || done == 1)
      logger_.log(m);
    else
      logger_.event(to_json_line(m));
    logger_.progress(ts_.global_step, shape_.total_steps, m.loss);
  }

  // The command that resumes this run (as many ranks again; any number works), from the latest checkpoint or `from`.
  std::string resume_with(const std::string& from = "") const {
    std::string cmd = resume_command(cfg_);
    const std::string latest = "resume_from_checkpoint=auto";
    if (!from.empty() && cmd.size() >= latest.size())
      cmd.replace(cmd.size() - latest.size(), latest.size(), "resume_from_checkpoint=" + from);
    const std::string self = "lazytrain ";
    if (!dp_ || cmd.rfind(self, 0) != 0) return cmd;
    return fmt::format("lazytrain launch -n {} -- {}", dp_->world(), cmd.substr(self.size()));
  }

  // A stop request between the micro-batches of step N+1: nothing of it was applied; the state of step N is saved
  // (unless it already was, or it is the state after non-finite steps) and the run stops as after a step.
  void stop_mid_step(const StepInterrupted& e) {
    logger_.message(fmt::format("step {}: stopped before micro-batch {} of {}; the step is not applied",
                                ts_.global_step + 1, e.next + 1, e.total));
    if (steps_this_run_ == 0) {  // the state is the one this run started from: nothing to save
      logger_.message(fmt::format("training stopped during its first step: nothing was trained in this run, nothing "
                                  "saved{}", resume_ ? fmt::format("; resume again from {}", resume_->string()) : ""));
      result_.interrupted = true;
      return;
    }
    const bool savable = streak_.length() == 0;
    if (savable && !saved_at_current_) {
      save();
      saved_at_current_ = true;
    }
    report_stop(savable);
  }

  void report_stop(bool saved) {
    const int sig = StopSignals::signal_number();
    const std::string by = sig == SIGINT ? " by SIGINT" : sig == SIGTERM ? " by SIGTERM" : "";
    const fs::path last = last_good_checkpoint();
    if (saved)
      logger_.message(fmt::format("training stopped{} after step {}/{}; checkpoint saved to {}.\nResume with: {}", by,
                                  ts_.global_step, shape_.total_steps, result_.last_checkpoint.string(), resume_with()));
    else  // inside a run of non-finite steps
      logger_.message(fmt::format("training stopped{} after step {}/{}; no checkpoint saved: {} non-finite.{}", by,
                                  ts_.global_step, shape_.total_steps,
                                  streak_.length() == 1 ? std::string("the last step was")
                                                        : fmt::format("the last {} steps were", streak_.length()),
                                  last.empty() ? std::string(" There is no checkpoint to resume from.")
                                               : fmt::format("\nResume from the last good checkpoint with: {}",
                                                             resume_with(last.string()))));
    result_.interrupted = true;
  }

  const TrainConfig& cfg_;
  const TrainHooks& hooks_;
  const fs::path out_;
  std::unique_ptr<DataParallel> dp_;  // null: one process
  bool leader_ = true;                // writes the output directory and the console (rank 0)
  OutputLock output_lock_;            // held for the whole run (rank 0 of a data-parallel run)
  std::optional<fs::path> resume_;
  ModelSetup ms_;
  data::PreparedData data_;
  data::DataLoader loader_;
  StepShape shape_;
  DeviceProbe probe_;
  TrainingPlan tp_;
  BackendChoice bc_;
  HostState st_;
  std::unique_ptr<AdamWHook> hook_;  // one process only
  std::optional<optim::UpdaterStats> opt_prev_start_;
  bool geometry_prepared_ = false;  // Executor::prepare ran for the first step's batches  // the optimizer's counters at the previous step's start
  TrainerState ts_;
  MetricsLogger logger_;
  FlopModel flops_;
  double peak_;
  std::string config_yaml_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<StopSignals> signals_;
  std::vector<data::Batch> val_batches_, batches_;
  std::vector<std::vector<int32_t>> targets_;
  TrainResult result_;
  NonFiniteStreak streak_{cfg_.schedule.max_skipped_steps};  // consecutive non-finite steps (gradient norm or loss)
  NonFiniteStep streak_first_;                      // the diagnosis of the streak's first step
  int64_t steps_this_run_ = 0;
  bool saved_at_current_ = false;
  bool extreme_gradients_warned_ = false;
};

// Under `lazytrain launch -n N` (N > 1) this process is one rank of a data-parallel run.
bool data_parallel_rank() {
  const dist::DistEnv env = dist::dist_env_from_environment();
  return env.launched && env.world > 1;
}

// A stop asked for (SIGINT/SIGTERM) before the first step: nothing trained, nothing to save.
TrainResult stopped_during_setup(const std::string& where) {
  const int sig = StopSignals::signal_number();
  const char* by = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a stop request";
  std::printf("training stopped by %s %s, before the first step: nothing was trained, nothing saved\n", by,
              where.c_str());
  std::fflush(stdout);
  TrainResult r;
  r.interrupted = true;
  return r;
}

}  // namespace

TrainResult run_training(const TrainConfig& config, const TrainHooks& hooks) {
  const TrainConfig cfg = with_rank_threads(config);
  check_host_mem(cfg.placement.host_mem);  // before anything is loaded
  if (cfg.placement.threads > 0) {
    openblas_set_num_threads(int(cfg.placement.threads));
    omp_set_num_threads(int(cfg.placement.threads));
  }
  // One process takes SIGINT/SIGTERM from the start: a stop during the setup (reading and tokenising the data,
  // initialising the weights) ends the run there instead of after its first step.
  const bool rank = data_parallel_rank();
  std::unique_ptr<StopSignals> signals;
  if (hooks.install_signal_handlers && !rank) signals = std::make_unique<StopSignals>();
  std::optional<NonFiniteStopped> stopped;
  {
    std::optional<TrainSession> session;
    try {
      session.emplace(cfg, hooks);
    } catch (const data::StopRequested& e) {
      return stopped_during_setup(e.what());
    }
    if (!rank && StopSignals::requested()) return stopped_during_setup("during the setup");
    try {
      return session->run();
    } catch (const NonFiniteStopped& e) {
      stopped = e;
    }
  }  // the session ends with no error in flight: a data-parallel rank's communicator does not abort its peers
  throw *stopped;
}

}  // namespace lt::train
