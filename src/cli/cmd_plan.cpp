// `lazytrain plan`: solve the activation schedule for a model x batch x machine and report it.
#include <cstdio>
#include <fstream>

#include "cli/commands.h"
#include "core/error.h"
#include "core/model_state.h"
#include "plan/heuristics.h"
#include "core/units.h"
#include "dist/rank_plan.h"
#include "model/accounting.h"
#include "model/model_config.h"
#include "plan/planner.h"
#include "plan/report.h"
#include "train/config.h"

namespace lt::cli {

namespace {

struct PlanOpts {
  std::string model, batch = "1", seq = "1024", profile = "h800-80g", planner = "milp", optimizer = "hybrid";
  std::string gpu_mem, host_mem, nvme_mem, out, svg, master, grads = "auto", grad_dtype = "auto", optimizer_nvme = "none",
              embedding_update = "auto", device_update_layers = "auto", head_gradient = "auto";
  int64_t chunk = 0;
  int ring = 2, micro = 1;
  std::string grad_ring_depth = std::to_string(kGradRingDepth);
  int world = 1, ranks_per_host = -1;  // -1: world
  double time_limit = 30, gap = 0.005, link_gbps = 0;
  double attention_fraction = 1.0;  // packed rows: the data's sum over a row's segments of len^2 / seq^2
  bool no_compare = false, verbose = false, no_keep_internals = false;
};

// --world-size / --ranks-per-host / --link-gbps as a topology; a clear error naming the option.
dist::Topology topology(const PlanOpts& o) {
  LT_CHECK(o.world >= 1, "--world-size must be >= 1, got {}", o.world);
  const int k = o.ranks_per_host == -1 ? o.world : o.ranks_per_host;
  LT_CHECK(k >= 1 && k <= o.world, "--ranks-per-host must be in [1, --world-size {}], got {}", o.world, o.ranks_per_host);
  LT_CHECK(o.world % k == 0, "--ranks-per-host {} must divide --world-size {} (every host runs as many ranks)", k,
           o.world);
  LT_CHECK(o.link_gbps >= 0, "--link-gbps must be >= 0, got {}", o.link_gbps);
  dist::Topology t;
  t.world = o.world;
  t.ranks_per_host = k;
  t.link_bw = o.link_gbps * 1e9;
  return t;
}

void add_options(CLI::App* sub, PlanOpts& o) {
  sub->add_option("--model", o.model, "model preset (e.g. qwen2.5-7b) or directory with config.json")->required();
  sub->add_option("--batch", o.batch, "samples per step, or 'max' for the largest feasible batch")->capture_default_str();
  sub->add_option("--seq", o.seq,
                  "sequence length, or 'max' for the longest feasible at --batch (a multiple of 1024 tokens)")
      ->capture_default_str();
  sub->add_option("--profile", o.profile, "resource profile: preset (h800-80g, rtx3090-24g, h200) or JSON file")->capture_default_str();
  sub->add_option("--planner", o.planner, kPlannerNames)->capture_default_str();
  sub->add_option("--gpu-mem", o.gpu_mem, "override the profile's GPU memory cap (e.g. 24GiB)");
  sub->add_option("--host-mem", o.host_mem, "override the profile's DRAM budget");
  sub->add_option("--nvme-mem", o.nvme_mem, "override the profile's NVMe capacity");
  sub->add_option("--optimizer", o.optimizer, "adamw | adamw8bit | hybrid")->capture_default_str();
  sub->add_option("--master-weights", o.master,
                  "fp32 | bf16-sr | auto (bf16-sr only if nothing else fits); default fp32")
      ->check(CLI::IsMember({"fp32", "bf16-sr", "auto"}));
  sub->add_option("--gradients", o.grads, "host | device | auto (device only if the host state does not fit)")
      ->check(CLI::IsMember({"host", "device", "auto"}))
      ->capture_default_str();
  sub->add_option("--gradient-dtype", o.grad_dtype,
                  "fp32 | bf16 | auto (of the gradients, held on the device or on the host; bf16 only if fp32 does not "
                  "fit)")
      ->check(CLI::IsMember({"fp32", "bf16", "auto"}));
  sub->add_option("--embedding-update", o.embedding_update,
                  "host | device | auto (a tied embedding's AdamW step on the GPU where it can)")
      ->check(CLI::IsMember({"host", "device", "auto"}))
      ->capture_default_str();
  sub->add_option("--device-update-layers", o.device_update_layers,
                  "auto | N (the first N layers' AdamW steps on the GPU; auto: the count that plans fastest)")
      ->capture_default_str();
  sub->add_option("--gradient-ring-depth", o.grad_ring_depth,
                  "auto | N: gradients held on the device, their pinned staging ring's depth in layers (less DRAM when "
                  "smaller; auto: the depth that plans fastest)")
      ->capture_default_str();
  sub->add_option("--head-gradient", o.head_gradient,
                  "full | slices | auto: gradients held on the device in bf16, the untied LM head's weight gradient "
                  "by vocabulary slices (no [vocab, hidden] fp32 buffers; one more logits GEMM); auto: the faster plan")
      ->check(CLI::IsMember({"full", "slices", "auto"}))
      ->capture_default_str();
  sub->add_option("--optimizer-nvme", o.optimizer_nvme,
                  "none | auto (the last layers' moments on the NVMe tier when nothing else fits DRAM) | all (every "
                  "layer's)")
      ->check(CLI::IsMember({"none", "auto", "all"}))
      ->capture_default_str();
  sub->add_option("--micro-batches", o.micro, "micro-batches per optimizer step (gradient accumulation)")->capture_default_str();
  sub->add_option("--attention-fraction", o.attention_fraction,
                  "packed rows: the expected sum over a row's segments of len^2 / seq^2 (the attention core's share "
                  "of the causal square it computes; `lazytrain train` samples it from the data); 1: one sequence a row")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str();
  sub->add_option("--ring", o.ring, "weight ring buffers on the GPU")->capture_default_str();
  sub->add_option("--chunk", o.chunk, "samples per chunk inside a layer pass (0: largest that fits)")->capture_default_str();
  sub->add_option("--time-limit", o.time_limit, "MILP time limit, seconds")->capture_default_str();
  sub->add_option("--gap", o.gap, "MILP relative gap to stop at")->capture_default_str();
  sub->add_option("-o,--output", o.out, "write the plan JSON here");
  sub->add_option("--svg", o.svg, "write the simulated timeline SVG here");
  sub->add_option("--world-size", o.world,
                  "data-parallel ranks in all: plan one rank (its share of the host, the collectives on its PCIe "
                  "lanes); --host-mem is then the host's budget")
      ->capture_default_str();
  sub->add_option("--ranks-per-host", o.ranks_per_host, "ranks sharing one host's DRAM and CPU (default: --world-size)");
  sub->add_option("--link-gbps", o.link_gbps,
                  "GPU-GPU link bandwidth per direction in GB/s (NVLink; default 0: through PCIe), for the reported "
                  "link time")
      ->capture_default_str();
  sub->add_flag("--no-compare", o.no_compare, "do not score the heuristics side by side");
  sub->add_flag("--no-keep-internals", o.no_keep_internals,
                "never keep the last layers' forward internals in GPU memory for their backward (Plan::kept_layers 0)");
  sub->add_flag("--verbose", o.verbose, "CBC log");
}

// Granule of `--seq max`: the answer is a multiple of it.
constexpr int64_t kSeqGranule = 1024;

// A positive count given as text (--batch, --seq); 'max' is handled by the caller.
int64_t positive_count(const std::string& text, const char* option) {
  int64_t v = 0;
  size_t used = 0;
  try {
    v = std::stoll(text, &used);
  } catch (...) {
    used = 0;
  }
  LT_CHECK(used == text.size() && v >= 1, "{} must be a positive integer or 'max', got '{}'", option, text);
  return v;
}

// The request the options describe (batch still unset: resolve_batch; --seq max: resolve_seq).
PlanRequest request_from(const PlanOpts& o, const dist::Topology& topo) {
  LT_CHECK(o.batch != "max" || o.seq != "max",
           "--batch max and --seq max together: give one of them a number (the other is searched at it)");
  PlanRequest r;
  r.model = resolve_model(o.model);
  r.seq = o.seq == "max" ? kSeqGranule : positive_count(o.seq, "--seq");
  r.profile = resolve_profile(o.profile);
  if (!o.gpu_mem.empty()) {
    r.profile.hbm_bytes = parse_bytes(o.gpu_mem);
    r.profile.hbm_reserve = std::min(r.profile.hbm_reserve, r.profile.hbm_bytes / 8);
    r.profile.name += " gpu-mem " + o.gpu_mem;
  }
  if (!o.host_mem.empty()) r.profile.dram_bytes = parse_bytes(o.host_mem);
  if (!o.nvme_mem.empty()) r.profile.nvme_bytes = parse_bytes(o.nvme_mem);
  dist::plan_for_rank(r, topo);
  r.planner = canonical_planner(o.planner);
  r.optimizer = o.optimizer;
  if (o.master == "auto") r.allow_bf16_master = true;
  else if (!o.master.empty()) r.master = parse_master_mode(o.master);
  if (o.grads != "auto") r.grads = parse_grad_home(o.grads);
  if (o.grad_dtype != "auto") r.grad_dtype = parse_grad_dtype(o.grad_dtype);
  if (o.embedding_update != "auto") r.embedding_update_device = o.embedding_update == "device";
  r.device_update_layers = train::parse_auto_count(o.device_update_layers, "plan: --device-update-layers", 0);
  r.allow_nvme_moments = o.optimizer_nvme == "auto";
  const auto depth = train::parse_auto_count(o.grad_ring_depth, "plan: --gradient-ring-depth", 1);
  r.grad_ring_depth = depth ? int(*depth) : 0;
  if (o.head_gradient != "auto") r.head_grad_slices = o.head_gradient == "slices";
  r.nvme_all_layers = o.optimizer_nvme == "all";
  r.ring = o.ring;
  r.micro_batches = o.micro;
  r.attention_fraction = o.attention_fraction;
  r.chunk = o.chunk;
  r.compare = !o.no_compare;
  r.keep_internals = !o.no_keep_internals;
  r.milp.time_limit_s = o.time_limit;
  r.milp.rel_gap = o.gap;
  r.milp.verbose = o.verbose;
  return r;
}

// --batch N, or 'max': the largest feasible batch (printed, with MegaTrain's for comparison).
void resolve_batch(PlanRequest& r, const std::string& batch) {
  if (batch != "max") {
    r.batch = positive_count(batch, "--batch");
    return;
  }
  std::fprintf(stderr, "searching the largest feasible batch...\n");
  const int64_t b = max_feasible_batch(r, r.planner);
  LT_CHECK(b > 0, "plan: even batch 1 does not fit: {}", [&] {
    PlanRequest q = r;
    q.batch = 1;
    q.compare = true;
    return make_plan(q).why;
  }());
  std::printf("max feasible batch: %lld (%s)\n", (long long)b, r.planner.c_str());
  if (r.planner != "megatrain:4")
    std::printf("max feasible batch: %lld (megatrain:4)\n", (long long)max_feasible_batch(r, "megatrain:4"));
  r.batch = b;
}

// Why `seq` tokens do not fit at the request's batch: the shortfall in the space --seq max searched (the DP's,
// or the heuristic's), and the smallest change that fits (fit_advice.h).
std::string why_not_at(PlanRequest r, int64_t seq) {
  r.seq = seq;
  r.compare = false;
  r.keep_internals = false;
  if (r.planner == "milp") r.planner = "dp";
  return make_plan(r).why;
}

// --seq max: the longest feasible sequence at the batch (printed with why the next size does not fit, and
// MegaTrain's for comparison).
void resolve_seq(PlanRequest& r, const std::string& seq) {
  if (seq != "max") return;
  std::fprintf(stderr, "searching the longest feasible sequence (multiples of %lld tokens) at batch %lld...\n",
               (long long)kSeqGranule, (long long)r.batch);
  const int64_t hi = int64_t(1) << 24;
  const int64_t s = max_feasible_seq(r, r.planner, kSeqGranule, hi);
  LT_CHECK(s > 0, "plan: even seq {} does not fit at batch {}: {}", kSeqGranule, r.batch, why_not_at(r, kSeqGranule));
  std::printf("max feasible seq: %lld at batch %lld (%s, multiples of %lld tokens)\n", (long long)s,
              (long long)r.batch, r.planner.c_str(), (long long)kSeqGranule);
  if (s + kSeqGranule > hi)
    std::printf("  longer not tried: %lld is the search's upper end\n", (long long)hi);
  else
    std::printf("  seq %lld %s\n", (long long)(s + kSeqGranule), why_not_at(r, s + kSeqGranule).c_str());
  if (r.planner != "megatrain:4")
    std::printf("max feasible seq: %lld (megatrain:4)\n", (long long)max_feasible_seq(r, "megatrain:4", kSeqGranule, hi));
  if (s > r.model.max_position)
    std::printf("  note: beyond the model's max_position_embeddings %lld (positions past it need RoPE scaling)\n",
                (long long)r.model.max_position);
  r.seq = s;
}

// The report, the data-parallel line, and the plan JSON / timeline SVG when asked for.
void write_outputs(const PlanOpts& o, const dist::Topology& topo, const PlanRequest& r, const PlanOutcome& out) {
  std::fputs(plan_report(r, out).c_str(), stdout);
  if (r.world > 1) {
    std::fputs(dist::rank_memory_line(r, out).c_str(), stdout);
    const auto c = dist::step_collectives(parameter_count(r.model), topo, r.profile, dist::CollectivePath::HostStaged);
    std::printf("  GPU-GPU link: %s per rank and step (%.1f ms at %s)\n", format_bytes(c.link).c_str(), c.link_s * 1e3,
                topo.link_bw > 0 ? fmt::format("{:g} GB/s", o.link_gbps).c_str() : "the PCIe H2D rate");
  }
  if (!out.feasible) fail("{}", out.why);
  if (!o.out.empty()) {
    save_plan(out.plan, o.out);
    std::printf("wrote %s\n", o.out.c_str());
  }
  if (!o.svg.empty()) {
    std::ofstream f(o.svg);
    LT_CHECK(f.good(), "cannot write {}", o.svg);
    f << timeline_svg(out.sim, fmt::format("{} batch {} seq {} on {}: {} plan, step {:.1f} ms", r.model.name, r.batch,
                                           r.seq, r.profile.name, out.plan.planner, out.sim.pred.step_s * 1e3));
    std::printf("wrote %s\n", o.svg.c_str());
  }
}

}  // namespace

void add_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOpts>();
  auto* sub = app.add_subcommand("plan", "Solve the activation checkpoint / offload / recompute schedule (MILP, DP, heuristics)");
  add_options(sub, *o);
  sub->callback([o] {
    const dist::Topology topo = topology(*o);
    PlanRequest r = request_from(*o, topo);
    resolve_batch(r, o->batch);
    resolve_seq(r, o->seq);
    write_outputs(*o, topo, r, make_plan(r));
  });
}

}  // namespace lt::cli
