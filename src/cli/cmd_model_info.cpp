// `lazytrain model-info --model <dir|preset> [--batch B --seq S]`: parameter count, bytes per unit
// (fp32 master, bf16 streaming copy, fp32 gradient, AdamW state fp32 or 8-bit), activation bytes and
// FLOPs per layer at B x S. With --write-random DIR: also writes a seeded random-init model
// directory in HF format (config.json, generation_config.json, safetensors).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/units.h"
#include "io/model_io.h"
#include "model/accounting.h"
#include "model/init.h"
#include "model/model_config.h"
#include "model/param_layout.h"
#include "optim/optimizer.h"

namespace lt::cli {

namespace {

std::string grouped(int64_t v) {  // 494032768 -> "494,032,768"
  std::string s = std::to_string(v < 0 ? -v : v), r;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) r += ',';
    r += s[i];
  }
  return v < 0 ? "-" + r : r;
}

std::string flops(double f) {
  const char* u[] = {"", "K", "M", "G", "T", "P", "E"};
  int i = 0;
  while (f >= 1000.0 && i < 6) {
    f /= 1000.0;
    ++i;
  }
  return fmt::format("{:.3f} {}FLOP", f, u[i]);
}

struct UnitBytes {
  int64_t params = 0, opt8 = 0;
};

// 8-bit state for 2-D weights (embeddings and LM head included here, as an upper bound of what a
// plan may select), fp32 for norms and biases.
UnitBytes unit_bytes(const UnitLayout& u) {
  UnitBytes b;
  for (auto& p : u.params) {
    b.params += p.numel;
    b.opt8 += optim::state_bytes(p.numel, p.is_matrix ? optim::StateFormat::Q8 : optim::StateFormat::F32);
  }
  return b;
}

// The layer kinds the model has, each with its first layer (whose layout every layer of the kind shares).
struct KindInfo {
  LayerKind kind;
  int64_t count = 0;
  const UnitLayout* layout = nullptr;
  LayerCost cost;
};
std::vector<KindInfo> kinds_of(const ModelConfig& c, const ModelLayout& lay, int64_t batch, int64_t seq) {
  std::vector<KindInfo> v;
  for (LayerKind k : {LayerKind::Attention, LayerKind::GatedDeltaNet}) {
    const int64_t n = c.count(k);
    if (n == 0) continue;
    int64_t first = 0;
    while (c.kind(first) != k) ++first;
    v.push_back({k, n, &lay.layer(first), layer_cost(c, k, batch, seq, 2)});
  }
  return v;
}

struct Options {
  std::string model;
  int64_t batch = 1, seq = 1024, head_chunk = 1024;
  std::string write_dir, save_dtype = "bf16", max_shard = "5GiB";
  uint64_t seed = 1;
  bool json = false;
};

// Same figures as the table, machine-readable (bytes and FLOPs as plain numbers).
void print_json(const ModelConfig& c, const ModelLayout& lay, const Options& o, const std::vector<KindInfo>& kinds) {
  auto unit = [](const UnitLayout& u) {
    UnitBytes b = unit_bytes(u);
    return nlohmann::json{{"params", b.params},          {"fp32_master_bytes", b.params * 4},
                          {"bf16_copy_bytes", b.params * 2}, {"fp32_grad_bytes", b.params * 4},
                          {"adamw_fp32_bytes", b.params * 8}, {"adamw_8bit_bytes", b.opt8}};
  };
  auto cost = [](const LayerCost& lc) {
    return nlohmann::json{{"params", lc.params},
                          {"flops_fwd", lc.flops_fwd},
                          {"flops_core_fwd", lc.flops_core_fwd},
                          {"flops_bwd", lc.flops_bwd},
                          {"boundary_bytes", lc.boundary_bytes},
                          {"internal_bytes", lc.internal_bytes},
                          {"workspace_bytes", lc.workspace_bytes}};
  };
  const int64_t T = o.batch * o.seq;
  nlohmann::json per_kind = nlohmann::json::object();
  for (auto& k : kinds) {
    nlohmann::json e = cost(k.cost);
    e["count"] = k.count;
    e["unit"] = unit(*k.layout);
    per_kind[layer_kind_short_name(k.kind)] = e;
  }
  nlohmann::json j = {
      {"model", c.name},
      {"config", model_config_to_json(c)},
      {"parameters", parameter_count(c)},
      {"units", {{"embedding", unit(lay.embedding())}, {"layer", unit(*kinds.front().layout)}, {"head", unit(lay.head())}}},
      {"batch", o.batch},
      {"seq", o.seq},
      {"tokens", T},
      {"layer", cost(kinds.front().cost)},
      {"layer_kinds", per_kind},
      {"head_flops_fwd", head_flops_fwd(c, T)},
      {"head_chunk_tokens", std::min(o.head_chunk, T)},
      {"head_chunk_workspace_bytes", head_chunk_workspace_bytes(c, std::min(o.head_chunk, T))},
      {"model_flops_per_step", model_flops_per_step(c, T)}};
  fmt::print("{}\n", j.dump(2));
}

void print_shape(const ModelConfig& c) {
  fmt::print("model       {} ({})\n", c.name, c.composite ? "Qwen3_5ForConditionalGeneration" : arch_hf_name(c.arch));
  fmt::print("shape       hidden {}, layers {}, heads {}/{} (head_dim {}), ffn {}, vocab {}\n", c.hidden, c.layers,
             c.heads, c.kv_heads, c.head_dim, c.ffn, c.vocab);
  fmt::print("features    {} embeddings, {}q/k/v bias, {}QK-norm, rms_eps {:g}, rope theta {}{}\n",
             c.tied ? "tied" : "untied", c.attn_bias ? "" : "no ", c.qk_norm ? "" : "no ", c.rms_eps, c.rope_theta,
             c.rope_scaling.type == "llama3"
                 ? fmt::format(" (llama3 scaling x{:g}, orig {})", c.rope_scaling.factor,
                               c.rope_scaling.original_max_position_embeddings)
                 : std::string());
  if (c.arch == Arch::Qwen3_5) {
    std::string order;
    for (int64_t i = 0; i < c.layers; ++i) order += c.kind(i) == LayerKind::Attention ? 'A' : 'D';
    fmt::print("hybrid      {} Gated DeltaNet (D) + {} full attention (A) layers: {}\n", c.count(LayerKind::GatedDeltaNet),
               c.count(LayerKind::Attention), order);
    fmt::print("            deltanet: {} key heads x {}, {} value heads x {}, conv kernel {}; attention: output gate, "
               "RoPE on {} of {} dims, (1 + w) RMSNorm\n",
               c.linear.k_heads, c.linear.k_head_dim, c.linear.v_heads, c.linear.v_head_dim, c.linear.conv_kernel,
               c.rotary_dim(), c.head_dim);
  }
}

void print_table(const ModelConfig& c, const ModelLayout& lay, const Options& o, const std::vector<KindInfo>& kinds,
                 int64_t N) {
  const int64_t T = o.batch * o.seq;
  const bool hybrid = kinds.size() > 1;
  auto kname = [&](const KindInfo& k) { return hybrid ? fmt::format(", {}", layer_kind_short_name(k.kind)) : std::string(); };
  print_shape(c);
  std::string per_layer;
  for (auto& k : kinds)
    per_layer += fmt::format("{}{} per {}layer", per_layer.empty() ? "" : ", ", grouped(k.cost.params),
                             hybrid ? std::string(layer_kind_short_name(k.kind)) + " " : std::string());
  fmt::print("parameters  {} total ({}), {}\n\n", grouped(N), format_bytes(double(N) * 4) + " fp32", per_layer);

  fmt::print("{:<24} {:>15} {:>12} {:>12} {:>12} {:>14} {:>14}\n", "bytes per unit", "params", "fp32 master",
             "bf16 copy", "fp32 grad", "AdamW fp32", "AdamW 8-bit");
  auto row = [&](const std::string& name, const UnitBytes& b, int64_t mult) {
    const int64_t p = b.params * mult;
    fmt::print("{:<24} {:>15} {:>12} {:>12} {:>12} {:>14} {:>14}\n", name, grouped(p), format_bytes(double(p) * 4),
               format_bytes(double(p) * 2), format_bytes(double(p) * 4), format_bytes(double(p) * 8),
               format_bytes(double(b.opt8 * mult)));
  };
  UnitBytes emb = unit_bytes(lay.embedding()), head = unit_bytes(lay.head());
  UnitBytes tot{emb.params + head.params, emb.opt8 + head.opt8};
  row("embedding", emb, 1);
  for (auto& k : kinds) {
    const UnitBytes lb = unit_bytes(*k.layout);
    row(fmt::format("layer (each{})", kname(k)), lb, 1);
    row(fmt::format("layers (x{}{})", k.count, kname(k)), lb, k.count);
    tot.params += lb.params * k.count;
    tot.opt8 += lb.opt8 * k.count;
  }
  row(c.tied ? "head (norm; tied)" : "head (norm+lm_head)", head, 1);
  row("total", tot, 1);
  fmt::print("(8-bit: blockwise m and v for 2-D weights, fp32 for norms and biases; grad: host fp32 accumulator)\n\n");

  const LayerCost& lc0 = kinds.front().cost;
  fmt::print("activations at batch {} x seq {} = {} tokens, bf16\n", o.batch, o.seq, grouped(T));
  fmt::print("  {:<64} {:>12}\n", "one boundary (tokens x hidden)", format_bytes(double(lc0.boundary_bytes)));
  fmt::print("  {:<64} {:>12}\n", fmt::format("all {} boundaries", c.layers + 1),
             format_bytes(double(lc0.boundary_bytes) * double(c.layers + 1)));
  for (auto& k : kinds) {
    fmt::print("  {:<64} {:>12}\n", fmt::format("layer internals saved for a recompute-free backward{}", kname(k)),
               format_bytes(double(k.cost.internal_bytes)));
    fmt::print("  {:<64} {:>12}\n", fmt::format("layer transient workspace (peak beyond internals){}", kname(k)),
               format_bytes(double(k.cost.workspace_bytes)));
  }
  const int64_t chunk = std::min(o.head_chunk, T);
  fmt::print("  {:<64} {:>12}\n", fmt::format("LM head + loss workspace ({}-token chunk, fp32)", chunk),
             format_bytes(double(head_chunk_workspace_bytes(c, chunk))));
  fmt::print("\nFLOPs at batch {} x seq {} (matmul 2*T*params; causal attention 2*B*S^2*q_dim; delta rule per "
             "docs/metrics.md; backward 2x)\n",
             o.batch, o.seq);
  double all = 0;
  for (auto& k : kinds) {
    fmt::print("  {:<64} {:>16}\n", fmt::format("layer forward{} (core {})", kname(k), flops(k.cost.flops_core_fwd)),
               flops(k.cost.flops_fwd));
    fmt::print("  {:<64} {:>16}\n", fmt::format("layer backward{}", kname(k)), flops(k.cost.flops_bwd));
    all += (k.cost.flops_fwd + k.cost.flops_bwd) * double(k.count);
  }
  fmt::print("  {:<64} {:>16}\n", fmt::format("all {} layers forward + backward", c.layers), flops(all));
  fmt::print("  {:<64} {:>16}\n", "LM head forward + backward", flops(3.0 * head_flops_fwd(c, T)));
  fmt::print("  {:<64} {:>16}\n", "6 * N * tokens (TFLOPS numerator per step)", flops(model_flops_per_step(c, T)));
}

void write_random(const ModelConfig& c, const Options& o) {
  SaveOptions so;
  LT_CHECK(o.save_dtype == "bf16" || o.save_dtype == "fp32", "--save-dtype: expected bf16 or fp32, got '{}'",
           o.save_dtype);
  so.dtype = o.save_dtype == "bf16" ? DType::BF16 : DType::F32;
  so.max_shard_bytes = parse_bytes(o.max_shard);
  ModelWeights w = random_model(c, o.seed);
  save_model(o.write_dir, w, so);
  fmt::print(stderr, "wrote random-init model (seed {}, {}) to {}\n", o.seed, o.save_dtype, o.write_dir);
}

void run(const Options& o) {
  ModelConfig c = resolve_model(o.model);
  ModelLayout lay = model_layout(c);
  LT_CHECK(o.batch > 0 && o.seq > 0, "--batch and --seq must be positive, got {} and {}", o.batch, o.seq);
  LT_CHECK(o.head_chunk > 0, "--head-chunk must be positive, got {}", o.head_chunk);
  const auto kinds = kinds_of(c, lay, o.batch, o.seq);
  const int64_t N = parameter_count(c);
  if (o.json) {
    print_json(c, lay, o, kinds);
  } else {
    print_table(c, lay, o, kinds, N);
  }
  if (!o.write_dir.empty()) write_random(c, o);
}

}  // namespace

void add_model_info(CLI::App& app) {
  auto opt = std::make_shared<Options>();
  auto* sub = app.add_subcommand("model-info", "Parameters, bytes and FLOPs of a model (directory or preset)");
  sub->add_option("--model", opt->model, "model directory, config.json, or preset (" +
                                             [] {
                                               std::string s;
                                               for (auto& n : preset_names()) s += (s.empty() ? "" : ", ") + n;
                                               return s;
                                             }() +
                                             ")")
      ->required();
  sub->add_option("--batch", opt->batch, "micro-batch size for activation bytes and FLOPs")->capture_default_str();
  sub->add_option("--seq", opt->seq, "sequence length")->capture_default_str();
  sub->add_option("--head-chunk", opt->head_chunk, "tokens per LM-head chunk")->capture_default_str();
  sub->add_option("--write-random", opt->write_dir, "also write a seeded random-init model directory (HF format)");
  sub->add_option("--seed", opt->seed, "seed for --write-random")->capture_default_str();
  sub->add_option("--save-dtype", opt->save_dtype, "bf16 or fp32 for --write-random")->capture_default_str();
  sub->add_option("--max-shard", opt->max_shard, "shard size limit for --write-random")->capture_default_str();
  sub->add_flag("--json", opt->json, "print the figures as JSON instead of a table");
  sub->callback([opt] { run(*opt); });
}

}  // namespace lt::cli
