// ResourceProfile: what the planner knows about the machine (capacities, bandwidths, compute rates,
// CPU optimizer throughput). Saved as JSON; presets in configs/profiles/<name>.json; measured by
// `lazytrain profile` (DRAM, NVMe and optimizer on any machine; GPU fields via a registered hook).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace lt {

// Per-layer times measured at one shape (the GPU profiler fills these). A timing is for one layer
// kind: attention entries match on heads/kv_heads/head_dim, Gated DeltaNet entries on the linear_*
// shape (JSON "kind": "full_attention" (default, so older profiles load) or "linear_attention").
struct LayerTiming {
  LayerKind kind = LayerKind::Attention;
  int64_t hidden = 0, ffn = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t linear_k_heads = 0, linear_v_heads = 0, linear_k_head_dim = 0, linear_v_head_dim = 0;
  int64_t batch = 0, seq = 0;
  double fwd_s = 0;  // one layer forward
  double bwd_s = 0;  // one layer backward, excluding the re-run of its forward internals
  // The backward when the forward kept its internals (Plan::kept_layers: no re-run), and the bytes one layer
  // keeps at this shape. 0: not measured (the planner keeps no layer of this kind).
  double bwd_kept_s = 0;
  int64_t keep_bytes = 0;
};

// A timing of a layer of kind k of model c (the shape fields that kind is matched on) at batch x seq.
// Inline: the CUDA backend's profiler fills timings too and does not link the planner.
inline LayerTiming layer_timing_for(const ModelConfig& c, LayerKind k, int64_t batch, int64_t seq, double fwd_s,
                                    double bwd_s) {
  LayerTiming t;
  t.kind = k;
  t.hidden = c.hidden;
  t.ffn = c.ffn;
  if (k == LayerKind::Attention) {
    t.heads = c.heads;
    t.kv_heads = c.kv_heads;
    t.head_dim = c.head_dim;
  } else {
    t.linear_k_heads = c.linear.k_heads;
    t.linear_v_heads = c.linear.v_heads;
    t.linear_k_head_dim = c.linear.k_head_dim;
    t.linear_v_head_dim = c.linear.v_head_dim;
  }
  t.batch = batch;
  t.seq = seq;
  t.fwd_s = fwd_s;
  t.bwd_s = bwd_s;
  return t;
}

struct ResourceProfile {
  std::string name;
  std::string source;  // where the numbers come from (spec sheet, measurement, command line)
  // Capacities, bytes.
  int64_t hbm_bytes = 0;       // GPU memory the executor may use (the cap)
  int64_t hbm_reserve = 0;     // part of it taken by context, allocator slack, kernels' scratch
  int64_t dram_bytes = 0;      // host memory lazytrain may use (model state + checkpoints + staging)
  int64_t nvme_bytes = 0;      // free space for NVMe-tier checkpoints
  std::string nvme_dir;        // where NVMe checkpoints go
  // Bandwidths, bytes/s.
  double h2d_bw = 0, d2h_bw = 0;  // pinned, one direction at a time
  double both_bw = 0;             // sum of both directions when they run at once
  double nvme_read_bw = 0, nvme_write_bw = 0;
  // The NVMe tier's io_uring queue (nvme/io_queue.h): the disk's latency for the rule (s; 0: its default), and the
  // rule's overrides (0: the rule's figure): requests in flight, bytes per request.
  double nvme_latency_s = 0;
  int nvme_queue_depth = 0;
  int64_t nvme_request_bytes = 0;
  double host_mem_bw = 0;         // host memory copy bandwidth (all threads)
  // Compute rates, FLOP/s (achieved, not peak).
  double gemm_flops = 0;  // bf16 dense GEMM
  double attn_flops = 0;  // attention (flash-style) counted as in model accounting
  double scan_flops = 0;  // Gated DeltaNet core (conv + chunked delta rule); 0: not given, attn_flops is used
  double peak_flops = 0;  // dense bf16 peak, for MFU
  // CPU optimizer throughput, parameters/s (AdamW step incl. bf16 copy write).
  double opt_fp32_params_per_s = 0;
  double opt_8bit_params_per_s = 0;
  std::vector<LayerTiming> layer_timings;  // optional measured per-layer times
  // The head (final norm, LM head and loss, forward and backward) measured at `tokens` rows of a model with this
  // hidden size and vocabulary (the GPU profiler; its time is linear in the rows: chunks of a fixed size). Its
  // GEMMs' FLOPs at gemm_flops undercount it by ~25 % (the logits' and the fp32 LM-head gradient's traffic per
  // chunk). tokens 0: not measured.
  struct HeadTiming {
    int64_t hidden = 0, vocab = 0, tokens = 0;
    double seconds = 0;
    // The same with the LM weight's gradient by vocabulary slices (StatePlacement::head_grad_slices: the pass without
    // it, then each slice's logits again and its gradient added into a bf16 one); 0: not measured.
    double sliced_seconds = 0;
  } head;
  // The backend's own layer workspace (saved internals + kernel scratch, one buffer sized for the largest
  // kind, the head and the embedding) for workspace_tokens rows, when a backend reported it (the GPU
  // profiler): the planner's per-kind estimate (model/accounting) must not be below it. 0: not given.
  int64_t workspace_bytes = 0, workspace_tokens = 0;
  // The same buffer at smaller sizes, (tokens, bytes) ascending (the GPU profiler: 1, 2, 4, ... samples): it is
  // not linear in the rows (the head's logits chunk grows up to the backend's own chunk rows, then stays), so
  // scaling workspace_bytes down to a small chunk undercounts it (measured: 5.75 GiB at 4 samples of Qwen3.5-9B
  // against ~2.4 scaled from 67). Empty: not given.
  std::vector<std::pair<int64_t, int64_t>> workspace_points;
  bool gpu_measured = false;               // GPU fields came from a measurement on this machine
};

nlohmann::json profile_to_json(const ResourceProfile& p);
// Strict: unknown fields, missing fields and non-positive rates are errors naming the field.
ResourceProfile profile_from_json(const nlohmann::json& j, const std::string& source);
ResourceProfile load_profile_file(const std::filesystem::path& path);
void save_profile(const ResourceProfile& p, const std::filesystem::path& path);
// A preset name (configs/profiles/<name>.json, searched in LT_PROFILE_DIR (plan_env.h), ./configs/profiles and
// the source tree) or a path to a JSON file.
ResourceProfile resolve_profile(const std::string& name_or_path);
std::vector<std::string> profile_preset_names();

// Forward/backward time of one layer of kind k at a shape: a measured LayerTiming of that kind and
// shape, else estimated from the model accounting's FLOP counts: matmuls at gemm_flops, the mixer
// core at attn_flops (attention) or scan_flops (Gated DeltaNet; attn_flops when absent).
struct LayerTimes {
  double fwd_s = 0, bwd_s = 0;
  // Kept internals (Plan::kept_layers), from the same timings as fwd_s/bwd_s: the backward without the re-run, and
  // the bytes one layer keeps for the batch. 0: not measured by a matching timing (estimates never keep).
  double bwd_kept_s = 0;
  double keep_bytes = 0;
  bool measured = false;
};
// The layer runs over the batch in chunks of `chunk` samples (0: the whole batch at once); with timings at several
// sample counts, the per-sample time is interpolated (in log samples) at the chunk's size, so a plan that runs
// one sample at a time pays the small GEMMs' lower rate.
LayerTimes layer_times(const ResourceProfile& p, const ModelConfig& c, LayerKind k, int64_t batch, int64_t seq,
                       int64_t chunk = 0);
// The attention core's share of one attention layer's times at batch x seq rows that are each one causal segment:
// its FLOPs (LayerCost::flops_core_fwd, all quadratic in the segment length) at the profile's attention rate
// attn_flops. Forward 1x; backward 2x for an estimate (layer_times' rule), 2.5x for a measured timing (the GPU
// profiler's attention rate counts forward + backward as 3.5x the forward FLOPs). Each share is at most the time.
struct AttentionShare {
  double fwd_s = 0, bwd_s = 0, bwd_kept_s = 0;
};
AttentionShare attention_share(const ResourceProfile& p, const ModelConfig& c, const LayerTimes& t, int64_t batch,
                               int64_t seq);
// layer_times for rows whose attention does `attention_fraction` of the full causal square's work (packed rows: the
// expected sum over a row's segments of len^2 / seq^2; docs/planner.md "Packed rows"): an attention layer's
// attention_share is scaled by it, the rest of its time and every other kind's are unchanged. Fraction 1:
// layer_times exactly. Throws lt::Error unless 0 < attention_fraction <= 1.
LayerTimes packed_layer_times(const ResourceProfile& p, const ModelConfig& c, LayerKind k, int64_t batch, int64_t seq,
                              int64_t chunk, double attention_fraction);
// The backend's workspace buffer for `tokens` rows from the profile (0 when it carries none): linear between
// the measured sizes (workspace_points and workspace_bytes; an upper bound, the buffer being convex in the rows),
// scaled by the rows from the nearest one outside them.
double backend_workspace_bytes(const ResourceProfile& p, int64_t tokens);
// Final norm + LM head + cross-entropy, forward and backward: the measured head timing scaled by the rows when it is
// of this model's hidden size and vocabulary, else its GEMMs at gemm_flops. sliced: the LM weight's gradient by
// vocabulary slices: its measured time where the profile has it, else 4/3 of the full pass's (a fourth logits-sized
// GEMM beside the forward's, dX's and dW's).
double head_time(const ResourceProfile& p, const ModelConfig& c, int64_t batch, int64_t seq, bool sliced = false);
// Achieved rate of a kind's mixer core (attn_flops, or scan_flops with attn_flops as the fallback).
double core_flops_rate(const ResourceProfile& p, LayerKind k);

// ---- measurement
// GPU hook: the CUDA backend registers a function that fills hbm_bytes, h2d/d2h/both bandwidths,
// gemm/attn rates and layer_timings for the given shape.
using GpuProfiler = void (*)(ResourceProfile&, const ModelConfig&, int64_t batch, int64_t seq);
void register_gpu_profiler(GpuProfiler f);
GpuProfiler gpu_profiler();  // nullptr when none is registered

using ProgressFn = std::function<void(const std::string&)>;
// Host memory bandwidth (multi-threaded memcpy), bytes/s.
double measure_host_bandwidth(int threads, int64_t bytes, const ProgressFn& progress = {});
// NVMe write then read bandwidth with O_DIRECT on a temporary file in dir (removed afterwards), then the request
// latency: the median of 64 single 4 KiB reads at random 4 KiB-aligned offsets of that file, one at a time.
struct NvmeBandwidth {
  double write_bw = 0, read_bw = 0;
  double latency_s = 0;  // the median 4 KiB read at queue depth 1, seconds (the profile's nvme_latency_us)
  int64_t free_bytes = 0;
  bool direct = true;  // false when the filesystem refused O_DIRECT (buffered I/O was measured)
};
NvmeBandwidth measure_nvme(const std::filesystem::path& dir, int64_t bytes, const ProgressFn& progress = {});

}  // namespace lt
