#include "train/planning.h"

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "plan/heuristics.h"
#include "core/host_memory.h"
#include "plan/state_report.h"
#include "core/log.h"
#include "train/nvme_space.h"
#include "core/timer.h"
#include "core/units.h"
#include "dist/rank_plan.h"
#include "exec/executor.h"
#include "exec/plan_adapter.h"
#include "model/accounting.h"
#include "optim/throughput.h"
#include "plan/planner.h"
#include "plan/report.h"

namespace lt::train {
namespace {

// MemAvailable, or 8 GiB when /proc/meminfo cannot be read.
int64_t available_or_default() {
  const int64_t b = mem_available_bytes();
  return b > 0 ? b : 8 * GiB;
}


// Achieved fp32 GEMM rate of this CPU at a layer-like shape (a few tens of ms).
double measure_cpu_gemm_flops(const ModelConfig& m) {
  const int64_t n = 256, k = std::max<int64_t>(64, m.hidden), o = std::max<int64_t>(64, m.ffn);
  std::vector<float> a(size_t(n * k), 0.5f), b(size_t(o * k), 0.25f), c(size_t(n * o));
  cpu::sgemm(false, true, n, o, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), o);  // warm-up
  double t0 = now_seconds();
  int reps = 0;
  while (now_seconds() - t0 < 0.03 || reps < 2) {
    cpu::sgemm(false, true, n, o, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), o);
    ++reps;
  }
  double dt = now_seconds() - t0;
  return 2.0 * double(n * k * o) * reps / dt;
}

}  // namespace

bool measure_profile_nvme(ResourceProfile& p) {
  constexpr int64_t kBytes = int64_t(256) << 20;
  if (p.nvme_dir.empty() || p.nvme_bytes < 2 * kBytes) return false;
  try {
    const NvmeBandwidth nv = measure_nvme(p.nvme_dir, kBytes);
    p.nvme_read_bw = nv.read_bw;
    p.nvme_write_bw = nv.write_bw;
    p.nvme_latency_s = nv.latency_s;
    log_info("profile: NVMe under {}: read {:.2f} GB/s, write {:.2f} GB/s, {:.0f} us a 4 KiB read{}", p.nvme_dir,
             nv.read_bw * 1e-9, nv.write_bw * 1e-9, nv.latency_s * 1e6, nv.direct ? "" : " (buffered: O_DIRECT refused)");
    return true;
  } catch (const Error& e) {
    log_warn("profile: the NVMe rates under {} were not measured ({}); planning with {:.2f} / {:.2f} GB/s", p.nvme_dir,
             e.what(), p.nvme_read_bw * 1e-9, p.nvme_write_bw * 1e-9);
    return false;
  }
}

namespace {

// The resource profile used when the config names none: the CPU backend's "device" is host memory,
// its PCIe is memcpy; figures are measured quickly here rather than assumed.
ResourceProfile default_profile(const PlacementSection& cfg, const ModelConfig& m, int64_t batch, int64_t seq,
                                bool on_gpu) {
  ResourceProfile p;
  // Without host_mem the plan may use what is available less a reserve for the process itself (CUDA
  // context, data, allocator slack, page cache): planning to MemAvailable got a 7B run with fp32
  // moments killed for memory on the 125 GiB H200 host; 15 % (at least 2 GiB) left it at
  // 102 GiB RSS with a 104 GiB plan.
  const int64_t avail = available_or_default();
  const int64_t reserve = std::max<int64_t>(int64_t(2) << 30, avail * 15 / 100);
  p.dram_bytes = cfg.host_mem.empty() ? std::max<int64_t>(avail / 2, avail - reserve) : parse_bytes(cfg.host_mem);
  p.nvme_dir = cfg.nvme_dir;
  p.nvme_bytes = cfg.nvme_dir.empty()       ? 0
                 : !cfg.nvme_mem.empty() ? parse_bytes(cfg.nvme_mem)
                                         : std::max<int64_t>(0, free_disk_bytes_of_future_dir(cfg.nvme_dir));
  p.nvme_read_bw = p.nvme_write_bw = 1e9;
  if (on_gpu) {
    LT_CHECK(gpu_profiler() != nullptr,
             "plan: no GPU profiler is available to measure this GPU; set `profile:` to a profile JSON or a "
             "preset ({})",
             fmt::join(profile_preset_names(), ", "));
    p.name = "measured-gpu";
    p.source = "measured at start by lazytrain train (GPU profiler)";
    gpu_profiler()(p, m, batch, seq);
    measure_profile_nvme(p);  // the assumed 1 GB/s where it cannot
    if (!cfg.gpu_mem.empty()) p.hbm_bytes = std::min(p.hbm_bytes, parse_bytes(cfg.gpu_mem));
    // The CPU optimizer lane runs on this host: measure it with the real kernels (a fraction of a
    // second), so the planner predicts the exposed optimizer time instead of treating it as unknown.
    const int threads = cfg.threads > 0 ? int(cfg.threads) : int(std::max(1u, std::thread::hardware_concurrency()));
    p.host_mem_bw = measure_host_bandwidth(threads, 256 * MiB);
    // 128M parameters (~2 GB of buffers for a moment): with 32M the 8-bit rate read 4.3-7.1 Gparams/s
    // over five runs on one H200 host against 7.5-9.0 from bench_optim on 268M.
    // At most 1/32 of the available memory (18 B per parameter for the fp32 run).
    const int64_t rate_n = std::clamp<int64_t>(avail / 32 / 18, 8 * MiB, 128 * MiB);
    // The optimizer itself (its pool, work items and split masters), not its kernels alone: the kernel-only figure
    // read 6.3-6.8 Gparams/s (8-bit) on the H200 host against 7.9-8.5 in training, 2-3x the exposed time.
    p.opt_fp32_params_per_s = optim::measure_optimizer_rate(false, threads, rate_n);
    p.opt_8bit_params_per_s = optim::measure_optimizer_rate(true, threads, rate_n);
    log_info("profile: host memory {:.1f} GB/s (copy), CPU AdamW {:.0f} Mparams/s fp32, {:.0f} Mparams/s 8-bit ({} threads)",
             p.host_mem_bw * 1e-9, p.opt_fp32_params_per_s * 1e-6, p.opt_8bit_params_per_s * 1e-6, threads);
  } else {
    p.name = "cpu-backend";
    p.source = "estimated at start by lazytrain train: CPU backend, device = host memory, copies = memcpy";
    // The CPU backend keeps activations and weights in fp32, twice the planner's bf16 byte counts,
    // so the planner sees half of the device budget.
    int64_t dev = cfg.gpu_mem.empty() ? avail / 2 : parse_bytes(cfg.gpu_mem);
    p.hbm_bytes = dev / 2;
    p.hbm_reserve = 0;
    p.host_mem_bw = measure_host_bandwidth(1, 8 * MiB);
    p.h2d_bw = p.d2h_bw = p.host_mem_bw;
    p.both_bw = p.host_mem_bw;
    p.gemm_flops = measure_cpu_gemm_flops(m);
    p.attn_flops = p.gemm_flops / 4;  // scalar attention loops: slower than BLAS
    p.peak_flops = p.gemm_flops;
    // AdamW moves ~30 bytes per parameter (fp32 p, g, m, v read; p, m, v written), 8-bit ~18.
    p.opt_fp32_params_per_s = p.host_mem_bw / 30.0;
    p.opt_8bit_params_per_s = p.host_mem_bw / 18.0;
  }
  return p;
}

// The planner's request from the config: its memory, planner and placement strings parsed, this rank's share of the
// host (topo) applied.
// The model-state placement: what the config fixes, the rest the planner's choice (plan/placement.h).
void place_state(PlanRequest& r, const PlacementSection& p, bool on_gpu) {
  if (p.master_weights == MasterWeights::Auto) r.allow_bf16_master = true;
  else r.master = p.master_weights == MasterWeights::Bf16Sr ? MasterMode::Bf16Sr : MasterMode::Fp32;
  if (p.gradients != GradientHome::Auto) r.grads = p.gradients == GradientHome::Device ? GradHome::Device : GradHome::Host;
  if (p.gradient_dtype != GradientDtype::Auto)
    r.grad_dtype = p.gradient_dtype == GradientDtype::Bf16 ? GradDType::Bf16 : GradDType::F32;
  r.allow_nvme_moments = p.optimizer_nvme == OptimizerNvme::Auto;  // config_sections.cpp: needs nvme_dir
  r.nvme_all_layers = p.optimizer_nvme == OptimizerNvme::All;
  // The NVMe layers' master remainders on NVMe (the planner's last rung, StatePlacement::nvme_remainders): only where
  // the masters are split (a bf16-streaming backend: the GPU; the CPU backend streams its fp32 masters whole).
  r.allow_nvme_remainders = on_gpu;
  // Kept internals (Plan::kept_layers): only on the GPU (the CPU backend's kept backward still re-runs the forward).
  r.keep_internals = p.keep_internals && on_gpu;
  r.embedding_rows_first = p.embedding_rows_first;
  r.grad_ring_depth = p.gradient_ring_depth ? int(*p.gradient_ring_depth) : 0;  // 0: the planner's
  if (p.head_gradient != HeadGradient::Auto) r.head_grad_slices = p.head_gradient == HeadGradient::Slices;
  // The tied embedding's update on the GPU (exec/device_update.h): auto only on a GPU (the CPU backend's "device" is
  // one compute thread, slower than the multi-threaded CPU optimizer).
  if (p.embedding_update != EmbeddingUpdate::Auto)
    r.embedding_update_device = p.embedding_update == EmbeddingUpdate::Device;
  else if (!on_gpu) r.embedding_update_device = false;
  // The first layers' updates on the GPU: auto only on a GPU, and not with every layer's moments on NVMe.
  r.device_update_layers = p.device_update_layers;
  if (!r.device_update_layers && (!on_gpu || p.optimizer_nvme == OptimizerNvme::All)) r.device_update_layers = 0;
}

// The planner's request from the config: its memory budgets, planner and placement, this rank's share of the host
// (topo) applied.
PlanRequest plan_request_from_config(const TrainConfig& cfg, const ModelConfig& model, int64_t batch, int64_t seq,
                                     bool on_gpu, const dist::Topology& topo) {
  const PlacementSection& p = cfg.placement;
  PlanRequest r;
  r.model = model;
  r.batch = batch;
  r.seq = seq;
  r.profile = p.profile.empty() ? default_profile(p, model, batch, seq, on_gpu) : resolve_profile(p.profile);
  if (!p.profile.empty()) {
    if (!p.gpu_mem.empty()) r.profile.hbm_bytes = parse_bytes(p.gpu_mem);
    if (!p.host_mem.empty()) r.profile.dram_bytes = parse_bytes(p.host_mem);
    if (!p.nvme_mem.empty()) r.profile.nvme_bytes = parse_bytes(p.nvme_mem);
    if (!p.nvme_dir.empty()) r.profile.nvme_dir = p.nvme_dir;
  }
  r.planner = canonical_planner(p.planner);  // one list of names: plan/heuristics.h
  r.optimizer = name_of(cfg.optimizer.type);
  // Predictions per optimizer step, as measured: a process (a data-parallel rank too) runs
  // gradient_accumulation_steps micro-batches per step.
  r.micro_batches = int(cfg.schedule.gradient_accumulation_steps);
  // Data parallel: this rank's share of the host, the collectives on its lanes.
  dist::plan_for_rank(r, topo);
  // The CPU backend's "device" is this host's memory too: its estimated budget is shared alike.
  if (!on_gpu && p.profile.empty() && p.gpu_mem.empty()) r.profile.hbm_bytes /= topo.ranks_per_host;
  place_state(r, p, on_gpu);
  r.compare = false;
  return r;
}

struct SolvedPlan {
  PlanOutcome outcome;
  double seconds = 0;  // the planner's wall time
};

// Runs the planner; throws when no plan fits or the plan contradicts the config.
SolvedPlan solve_plan(const PlacementSection& cfg, const PlanRequest& r) {
  const double t0 = now_seconds();
  SolvedPlan s{make_plan(r), 0};
  s.seconds = now_seconds() - t0;
  const PlanOutcome& o = s.outcome;
  if (!o.feasible)
    fail("{} (planner {}, batch {}, seq {}; profile {})", o.why, r.planner, r.batch, r.seq, r.profile.name);
  // gradient_dtype: bf16 holds for gradients on the device and on the host alike (core/model_state.h).
  LT_CHECK(cfg.gradient_dtype != GradientDtype::Bf16 || o.placement.grad_dtype == GradDType::Bf16,
           "internal: gradient_dtype bf16 was asked for, but the plan keeps the gradients ({}) in {}",
           grad_home_name(o.placement.grads), grad_dtype_name(o.placement.grad_dtype));
  LT_CHECK(cfg.head_gradient != HeadGradient::Slices || o.placement.head_grad_slices,
           "head_gradient: slices needs gradients held on the device in bf16 and an LM head of its own, but {}: use "
           "head_gradient auto (or gradients device and gradient_dtype bf16 for an untied model)",
           r.model.tied ? fmt::format("{} ties its LM head to the embedding", r.model.name)
                        : fmt::format("the plan keeps the gradients ({}) in {}", grad_home_name(o.placement.grads),
                                      grad_dtype_name(o.placement.grad_dtype)));
  return s;
}

// Over the units the CPU optimizer updates (those updated on the GPU have no CPU time); -1 when there are none.
double predicted_optimizer_params_per_s(const ModelConfig& model, const PlanOutcome& o) {
  const auto lay = model_layout(model);
  double t = 0, n = 0;
  for (size_t u = 0; u < o.inst.opt.size(); ++u) {
    if (o.inst.opt[u] <= 0) continue;
    t += o.inst.opt[u];
    n += double(unit_param_count(u < size_t(o.inst.L) ? lay.layer(int64_t(u)) : u == size_t(o.inst.L) ? lay.head()
                                                                                                   : lay.embedding()));
  }
  return t > 0 ? n / t : -1;
}

// Layer forwards per micro-batch beyond the forward pass: each layer's backward re-runs its forward, except the kept
// layers' (Plan::kept_layers), plus the recompute blocks'.
double extra_layer_forwards(const ModelConfig& model, const Plan& plan) {
  double block_recompute = 0;
  for (const auto& b : plan.blocks) block_recompute += double(b.end - b.start - 1);
  return double(model.layers - plan.kept_layers) + block_recompute;
}

// The TrainingPlan's fields from the planner's outcome (all but the summary).
TrainingPlan derive_training_plan(const PlacementSection& cfg, const ModelConfig& model, const PlanRequest& r,
                                  const PlanOutcome& o) {
  TrainingPlan tp;
  tp.exec = exec_plan_from(o.plan, model);  // o.plan.predicted is the chosen candidate's o.sim.pred
  tp.tensors_8bit.insert(o.plan.optimizer_8bit.begin(), o.plan.optimizer_8bit.end());
  tp.placement = o.placement;
  tp.model = model;
  tp.state_table = memory_table(o);
  tp.planner = o.chosen.empty() ? r.planner : o.chosen;
  tp.predicted_step_s = o.sim.pred.step_s;
  tp.predicted_tflops = o.sim.pred.tflops;
  tp.predicted_exposed_transfer_s = o.sim.pred.exposed_h2d_s + o.sim.pred.exposed_d2h_s + o.sim.pred.exposed_nvme_s;
  tp.predicted_exposed_optimizer_s = o.sim.pred.exposed_optimizer_s;
  tp.predicted_optimizer_params_per_s = predicted_optimizer_params_per_s(model, o);
  // The device budget the executor enforces: the profile's (the CPU backend's is twice the planner's view).
  tp.device_budget = cfg.gpu_mem.empty() ? -1 : parse_bytes(cfg.gpu_mem);
  tp.host_budget = cfg.host_mem.empty() ? -1 : parse_bytes(cfg.host_mem);
  tp.planned_dram = r.profile.dram_bytes;
  tp.nvme_queue = nvme_queue_shape(r.profile);
  tp.extra_layer_forwards = extra_layer_forwards(model, o.plan);
  tp.attention_fraction = r.attention_fraction;
  return tp;
}

// What the console summary of a plan says, gathered from the request, the outcome and the derived plan.
struct PlanSummary {
  std::string requested_planner, chosen_planner, profile, device;
  double plan_s = 0;
  int n_gpu = 0, n_cpu = 0, n_nvme = 0, n_none = 0;  // boundaries per tier
  int64_t blocks = 0, chunk = 0, batch = 0;
  int32_t ring = 0;
  std::string kept;  // " | kept ..." or empty
  std::string tiers, optimizer;
  int64_t eight_bit_tensors = 0, eight_bit_params = 0;
  std::string master, grads, state_notes;  // state_notes: the gradients' dtype, what updates on the GPU
  double step_s = 0, tflops = 0, exposed_transfer_ms = 0, exposed_optimizer_ms = 0;
  std::string hbm_peak, hbm_room, dram_peak, dram_room, nvme_used, nvme_room;
  std::optional<std::string> rank_memory;  // data parallel: this rank's memory line
};

std::string placement_notes(const StatePlacement& p) {
  return (p.grads == GradHome::Device || p.grad_dtype != GradDType::F32 ? fmt::format(" ({})", grad_dtype_name(p.grad_dtype))
                                                                         : std::string()) +
         (p.grads == GradHome::Device && p.grad_ring_depth != kGradRingDepth
              ? fmt::format(", a staging ring of {} layers", p.grad_ring_depth)
              : std::string()) +
         (p.head_grad_slices ? ", the head's gradient by vocabulary slices" : "") +
         (p.embedding_update_device ? ", the embedding's update on the GPU" : "") +
         (p.device_update_layers > 0
              ? fmt::format(", the first {} layers' updates on the GPU", p.device_update_layers)
              : std::string());
}

PlanSummary plan_summary_of(const PlanRequest& r, const SolvedPlan& solved,
                            const TrainingPlan& tp, const std::string& device_name) {
  const PlanOutcome& o = solved.outcome;
  PlanSummary s;
  s.requested_planner = r.planner;
  s.chosen_planner = tp.planner;
  s.plan_s = solved.seconds;
  s.profile = r.profile.name;
  s.device = device_name;
  for (Tier t : o.plan.tier)
    (t == Tier::Gpu ? s.n_gpu : t == Tier::Cpu ? s.n_cpu : t == Tier::Nvme ? s.n_nvme : s.n_none)++;
  s.blocks = int64_t(o.plan.blocks.size());
  s.chunk = o.plan.chunk;
  s.batch = o.plan.batch;
  s.ring = o.plan.ring;
  if (o.plan.kept_layers > 0)
    s.kept = fmt::format(" | kept {} (the last layers' internals, {})", o.plan.kept_layers, format_bytes(kept_hbm(o.inst)));
  s.tiers = describe_tiers(o.plan);
  s.optimizer = r.optimizer;
  s.eight_bit_tensors = o.eight_bit_tensors;
  s.eight_bit_params = o.eight_bit_params;
  s.master = master_mode_name(o.placement.master);
  s.grads = grad_home_name(o.placement.grads);
  s.state_notes = placement_notes(o.placement);
  s.step_s = tp.predicted_step_s;
  s.tflops = tp.predicted_tflops;
  s.exposed_transfer_ms = 1e3 * tp.predicted_exposed_transfer_s;
  s.exposed_optimizer_ms = 1e3 * tp.predicted_exposed_optimizer_s;
  s.hbm_peak = format_bytes(double(o.sim.pred.peak_hbm));
  s.hbm_room = format_bytes(double(r.profile.hbm_bytes - r.profile.hbm_reserve));
  s.dram_peak = format_bytes(double(o.sim.pred.peak_dram));
  s.dram_room = format_bytes(double(r.profile.dram_bytes));
  // The moments' files and the checkpoints (the simulator counts only the latter; its DRAM peak holds the state).
  s.nvme_used = format_bytes(double(o.sim.pred.nvme_bytes) + o.state.nvme());
  s.nvme_room = format_bytes(double(r.profile.nvme_bytes));
  if (r.world > 1) s.rank_memory = dist::rank_memory_line(r, o);
  return s;
}

std::string format_plan_summary(const PlanSummary& s) {
  std::string out = fmt::format(
      "plan: {} planner chose '{}' in {:.2f} s (profile '{}', device {})\n"
      "  boundaries: {} gpu, {} cpu, {} nvme, {} recomputed | {} recompute blocks | chunk {} of {} samples | ring {}{}\n"
      "  tiers: {}\n"
      "  optimizer: {} ({} tensors / {} params with 8-bit moments); master weights {}, gradients on the {}{}\n"
      "  predicted: {:.3f} s/step, {:.3f} TFLOPS, exposed transfer {:.1f} ms, exposed optimizer {:.1f} ms\n"
      "  memory: device peak {} of {}, host {} of {}, nvme {} of {}\n",
      s.requested_planner, s.chosen_planner, s.plan_s, s.profile, s.device, s.n_gpu, s.n_cpu, s.n_nvme, s.n_none,
      s.blocks, s.chunk, s.batch, s.ring, s.kept, s.tiers, s.optimizer, s.eight_bit_tensors, s.eight_bit_params,
      s.master, s.grads, s.state_notes, s.step_s, s.tflops, s.exposed_transfer_ms, s.exposed_optimizer_ms,
      s.hbm_peak, s.hbm_room, s.dram_peak, s.dram_room, s.nvme_used, s.nvme_room);
  if (s.rank_memory) out += "  " + *s.rank_memory;
  return out;
}

// plan.json, plan_report.txt and profile.json (the profile planned with, measured at start unless the config named
// one: `lazytrain plan --profile <output_dir>/profile.json` plans other shapes on this machine without measuring it
// again) in the output directory.
void write_plan_files(const std::string& output_dir, const PlanRequest& r, const PlanOutcome& o) {
  std::error_code ec;
  std::filesystem::create_directories(output_dir, ec);
  save_plan(o.plan, std::filesystem::path(output_dir) / "plan.json");
  save_profile(r.profile, std::filesystem::path(output_dir) / "profile.json");
  std::ofstream rep(std::filesystem::path(output_dir) / "plan_report.txt");
  rep << plan_report(r, o);
}

}  // namespace

// host_mem: the budget of this host's DRAM for the run (its ranks together). Above the machine's physical memory
// the plan would pass and the process be killed for memory once it used it.
void check_host_mem(const std::string& host_mem) {
  if (host_mem.empty()) return;
  const int64_t total = mem_total_bytes();
  LT_CHECK(total <= 0 || parse_bytes(host_mem) <= total,
           "host_mem {} is more than this machine's memory ({} MemTotal in /proc/meminfo): the plan would use memory "
           "that is not there and the run be killed once it does; set host_mem below that (unset: what is available "
           "less a reserve)", host_mem, format_bytes(double(total)));
}

double attention_fraction(const std::vector<data::Batch>& batches, bool packed) {
  StepRows rows;
  int64_t n = 0, seq = 0;
  for (const auto& b : batches) {
    LT_CHECK(seq == 0 || b.seq == seq, "attention fraction: micro-batches of {} and {} tokens per row", seq, b.seq);
    seq = b.seq;
    n += b.batch;
    for (int64_t i = 0; i < b.batch; ++i) add_row(rows, packed ? b.segments.data() + i * b.seq : nullptr, b.seq);
  }
  LT_CHECK(n > 0 && seq > 0, "attention fraction: no rows in {} micro-batches", batches.size());
  return rows.sum_sq_len / (double(n) * double(seq) * double(seq));
}

double sampled_attention_fraction(const std::vector<data::Sample>& samples, const data::LoaderOptions& lo,
                                  int64_t max_rows) {
  if (!lo.packing) return 1.0;
  data::DataLoader loader(&samples, lo);
  std::vector<data::Batch> batches;
  for (int64_t rows = 0; rows < std::max<int64_t>(1, max_rows); rows += lo.batch) batches.push_back(loader.next());
  return attention_fraction(batches, true);
}

TrainingPlan make_training_plan(const TrainConfig& cfg, const ModelConfig& model, int64_t batch, int64_t seq,
                                const std::string& device_name, bool on_gpu, const dist::Topology& topo,
                                double attention_fraction) {
  PlanRequest r = plan_request_from_config(cfg, model, batch, seq, on_gpu, topo);
  r.attention_fraction = attention_fraction;
  const SolvedPlan solved = solve_plan(cfg.placement, r);
  TrainingPlan tp = derive_training_plan(cfg.placement, model, r, solved.outcome);
  tp.summary = format_plan_summary(plan_summary_of(r, solved, tp, device_name));
  if (const std::string line = packed_rows_line(r); !line.empty()) tp.summary += "  " + line;
  if (!cfg.output.output_dir.empty()) write_plan_files(cfg.output.output_dir, r, solved.outcome);
  return tp;
}

IoQueueShape nvme_queue_shape(const ResourceProfile& p) {
  const double latency = p.nvme_latency_s > 0 ? p.nvme_latency_s : kDefaultIoLatency;
  return io_queue_shape(std::max(p.nvme_read_bw, p.nvme_write_bw), latency, unsigned(p.nvme_queue_depth),
                        p.nvme_request_bytes);
}

std::optional<int> local_world_size(int world) {
  const char* v = std::getenv("LT_LOCAL_WORLD_SIZE");
  if (!v) return std::nullopt;
  char* end = nullptr;
  const long k = std::strtol(v, &end, 10);
  const bool number = end != v && *end == 0 && k >= 1 && k <= (1 << 20);
  if (world <= 0) LT_CHECK(number, "LT_LOCAL_WORLD_SIZE must be a number of ranks on this host, got '{}'", v);
  LT_CHECK(world <= 0 || (number && k <= world && world % k == 0),
           "LT_LOCAL_WORLD_SIZE must be a number of ranks on this host in [1, {}] dividing the world size {}, "
           "got '{}'", world, world, v);
  return int(k);
}

dist::Topology rank_topology(int world) {
  dist::Topology t;
  t.world = world;
  t.ranks_per_host = local_world_size(world).value_or(world);
  return t;
}

}  // namespace lt::train
