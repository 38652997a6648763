// ResourceProfile JSON, presets and layer-time estimates. Measurements: profile_measure.cpp.
#include "plan/profile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/units.h"
#include "model/accounting.h"
#include "plan/plan_env.h"

namespace lt {

using nlohmann::json;

namespace {

// Bandwidths are written in GB/s (1e9 B/s), rates in TFLOP/s, throughputs in Mparams/s.
constexpr double kGB = 1e9, kTF = 1e12, kM = 1e6;

int64_t bytes_field(const json& v, const std::string& src, const std::string& k) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) {
    try {
      return parse_bytes(v.get<std::string>());
    } catch (const Error& e) {
      fail("{}: field '{}': {}", src, k, e.what());
    }
  }
  fail("{}: field '{}' must be a byte count (integer or string like \"80GiB\"), got {}", src, k, v.dump());
}

// The shape fields of a timing's kind: attention heads, or the Gated DeltaNet's linear_* shape.
std::vector<std::pair<const char*, int64_t LayerTiming::*>> kind_shape_fields(LayerKind k) {
  if (k == LayerKind::Attention)
    return {{"heads", &LayerTiming::heads}, {"kv_heads", &LayerTiming::kv_heads}, {"head_dim", &LayerTiming::head_dim}};
  return {{"linear_k_heads", &LayerTiming::linear_k_heads}, {"linear_v_heads", &LayerTiming::linear_v_heads},
          {"linear_k_head_dim", &LayerTiming::linear_k_head_dim}, {"linear_v_head_dim", &LayerTiming::linear_v_head_dim}};
}

json timing_to_json(const LayerTiming& t) {
  json e = {{"kind", layer_kind_hf_name(t.kind)}, {"hidden", t.hidden}, {"ffn", t.ffn}, {"batch", t.batch},
            {"seq", t.seq}, {"fwd_s", t.fwd_s}, {"bwd_s", t.bwd_s}};
  for (auto& [k, f] : kind_shape_fields(t.kind)) e[k] = t.*f;
  // Kept internals (Plan::kept_layers): only when measured, so profiles without them read as before.
  if (t.bwd_kept_s > 0) e["bwd_kept_s"] = t.bwd_kept_s;
  if (t.keep_bytes > 0) e["keep_bytes"] = t.keep_bytes;
  return e;
}

// Strict: unknown keys are errors; the shape fields of the entry's kind are required, the other
// kind's are optional (and ignored when matching).
LayerTiming timing_from_json(const json& e, const std::string& where) {
  static const std::set<std::string> known = {"kind", "hidden", "ffn", "heads", "kv_heads", "head_dim", "linear_k_heads",
                                              "linear_v_heads", "linear_k_head_dim", "linear_v_head_dim", "batch", "seq",
                                              "fwd_s", "bwd_s", "bwd_kept_s", "keep_bytes"};
  LT_CHECK(e.is_object(), "{}: expected an object", where);
  for (auto& [k, v] : e.items()) LT_CHECK(known.count(k), "{}: unknown field '{}'", where, k);
  LayerTiming t;
  if (e.contains("kind"))
    LT_CHECK(e["kind"].is_string() && parse_layer_kind(e["kind"].get<std::string>(), &t.kind),
             "{}: 'kind' must be \"full_attention\" or \"linear_attention\", got {}", where, e["kind"].dump());
  auto gi = [&](const char* k, int64_t LayerTiming::*f, bool required) {
    LT_CHECK(!required || e.contains(k), "{}: missing or non-integer '{}'", where, k);
    if (!e.contains(k)) return;
    LT_CHECK(e[k].is_number_integer(), "{}: missing or non-integer '{}'", where, k);
    t.*f = e[k].get<int64_t>();
  };
  auto gd = [&](const char* k) {
    LT_CHECK(e.contains(k) && e[k].is_number() && e[k].get<double>() > 0, "{}: missing or non-positive '{}'", where, k);
    return e[k].get<double>();
  };
  for (LayerKind k : {LayerKind::Attention, LayerKind::GatedDeltaNet})
    for (auto& [name, f] : kind_shape_fields(k)) gi(name, f, k == t.kind);
  gi("hidden", &LayerTiming::hidden, true);
  gi("ffn", &LayerTiming::ffn, true);
  gi("batch", &LayerTiming::batch, true);
  gi("seq", &LayerTiming::seq, true);
  t.fwd_s = gd("fwd_s");
  t.bwd_s = gd("bwd_s");
  // Optional (0: not measured); negative is an error.
  if (e.contains("bwd_kept_s")) {
    LT_CHECK(e["bwd_kept_s"].is_number() && e["bwd_kept_s"].get<double>() >= 0,
             "{}: 'bwd_kept_s' must be a number >= 0, got {}", where, e["bwd_kept_s"].dump());
    t.bwd_kept_s = e["bwd_kept_s"].get<double>();
  }
  if (e.contains("keep_bytes")) {
    LT_CHECK(e["keep_bytes"].is_number_integer() && e["keep_bytes"].get<int64_t>() >= 0,
             "{}: 'keep_bytes' must be an integer >= 0, got {}", where, e["keep_bytes"].dump());
    t.keep_bytes = e["keep_bytes"].get<int64_t>();
  }
  return t;
}

// Does a measured timing describe a layer of kind k of model c at sequence length seq?
bool timing_matches(const LayerTiming& t, const ModelConfig& c, LayerKind k, int64_t seq) {
  if (t.kind != k || t.hidden != c.hidden || t.ffn != c.ffn || t.seq != seq || t.batch <= 0) return false;
  if (k == LayerKind::Attention) return t.heads == c.heads && t.kv_heads == c.kv_heads && t.head_dim == c.head_dim;
  const auto& l = c.linear;
  return t.linear_k_heads == l.k_heads && t.linear_v_heads == l.v_heads && t.linear_k_head_dim == l.k_head_dim &&
         t.linear_v_head_dim == l.v_head_dim;
}

// The optional NVMe queue fields (nvme/io_queue.h): nvme_latency_us > 0, nvme_queue_depth in [1, 64],
// nvme_request_kib a multiple of 4 in [4, 8192].
void nvme_queue_fields(const json& j, const std::string& src, ResourceProfile& p) {
  if (j.contains("nvme_latency_us")) {
    const json& v = j["nvme_latency_us"];
    LT_CHECK(v.is_number() && v.get<double>() > 0, "{}: 'nvme_latency_us' must be a number > 0, got {}", src, v.dump());
    p.nvme_latency_s = v.get<double>() * 1e-6;
  }
  auto whole = [&](const char* k, int64_t lo, int64_t hi) {
    const json& v = j[k];
    LT_CHECK(v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi,
             "{}: '{}' must be a whole number in [{}, {}], got {}", src, k, lo, hi, v.dump());
    return v.get<int64_t>();
  };
  if (j.contains("nvme_queue_depth")) p.nvme_queue_depth = int(whole("nvme_queue_depth", 1, 64));
  if (j.contains("nvme_request_kib")) {
    const int64_t kib = whole("nvme_request_kib", 4, 8192);
    LT_CHECK(kib % 4 == 0, "{}: 'nvme_request_kib' must be a multiple of 4 (O_DIRECT's 4 KiB), got {}", src, kib);
    p.nvme_request_bytes = kib * 1024;
  }
}

}  // namespace

json profile_to_json(const ResourceProfile& p) {
  json j;
  j["name"] = p.name;
  j["source"] = p.source;
  j["hbm"] = p.hbm_bytes;
  j["hbm_reserve"] = p.hbm_reserve;
  j["dram"] = p.dram_bytes;
  j["nvme"] = p.nvme_bytes;
  j["nvme_dir"] = p.nvme_dir;
  j["h2d_gbps"] = p.h2d_bw / kGB;
  j["d2h_gbps"] = p.d2h_bw / kGB;
  j["both_gbps"] = p.both_bw / kGB;
  j["nvme_read_gbps"] = p.nvme_read_bw / kGB;
  j["nvme_write_gbps"] = p.nvme_write_bw / kGB;
  j["host_mem_gbps"] = p.host_mem_bw / kGB;
  j["gemm_tflops"] = p.gemm_flops / kTF;
  j["attn_tflops"] = p.attn_flops / kTF;
  j["peak_tflops"] = p.peak_flops / kTF;
  j["opt_fp32_mparams_per_s"] = p.opt_fp32_params_per_s / kM;
  j["opt_8bit_mparams_per_s"] = p.opt_8bit_params_per_s / kM;
  j["gpu_measured"] = p.gpu_measured;
  if (p.scan_flops > 0) j["scan_tflops"] = p.scan_flops / kTF;
  if (p.nvme_latency_s > 0) j["nvme_latency_us"] = p.nvme_latency_s * 1e6;
  if (p.nvme_queue_depth > 0) j["nvme_queue_depth"] = p.nvme_queue_depth;
  if (p.nvme_request_bytes > 0) j["nvme_request_kib"] = p.nvme_request_bytes / 1024;
  if (p.workspace_tokens > 0) {
    j["workspace_bytes"] = p.workspace_bytes;
    j["workspace_tokens"] = p.workspace_tokens;
  }
  if (!p.workspace_points.empty()) {
    json a = json::array();
    for (auto [t, b] : p.workspace_points) a.push_back({t, b});
    j["workspace_points"] = a;
  }
  json lt = json::array();
  for (auto& t : p.layer_timings) lt.push_back(timing_to_json(t));
  j["layer_timings"] = lt;
  if (p.head.tokens > 0) {
    j["head_timing"] = {{"hidden", p.head.hidden}, {"vocab", p.head.vocab}, {"tokens", p.head.tokens},
                        {"seconds", p.head.seconds}};
    if (p.head.sliced_seconds > 0) j["head_timing"]["sliced_seconds"] = p.head.sliced_seconds;
  }
  return j;
}

ResourceProfile profile_from_json(const json& j, const std::string& src) {
  LT_CHECK(j.is_object(), "{}: a profile must be a JSON object, got {}", src, j.type_name());
  static const std::set<std::string> known = {
      "name", "source", "hbm", "hbm_reserve", "dram", "nvme", "nvme_dir", "h2d_gbps", "d2h_gbps", "both_gbps",
      "nvme_read_gbps", "nvme_write_gbps", "host_mem_gbps", "gemm_tflops", "attn_tflops", "peak_tflops",
      "opt_fp32_mparams_per_s", "opt_8bit_mparams_per_s", "gpu_measured", "layer_timings", "notes", "scan_tflops",
      "workspace_bytes", "workspace_tokens", "workspace_points", "head_timing", "nvme_latency_us", "nvme_queue_depth",
      "nvme_request_kib"};
  for (auto& [k, v] : j.items()) LT_CHECK(known.count(k), "{}: unknown field '{}'", src, k);
  auto req = [&](const std::string& k) -> const json& {
    LT_CHECK(j.contains(k), "{}: missing field '{}'", src, k);
    return j.at(k);
  };
  auto num = [&](const std::string& k, double scale) {
    const json& v = req(k);
    LT_CHECK(v.is_number(), "{}: field '{}' must be a number, got {}", src, k, v.dump());
    double x = v.get<double>();
    LT_CHECK(x > 0, "{}: field '{}' must be positive, got {}", src, k, x);
    return x * scale;
  };
  ResourceProfile p;
  LT_CHECK(req("name").is_string() && req("source").is_string(), "{}: 'name' and 'source' must be strings", src);
  p.name = j["name"].get<std::string>();
  p.source = j["source"].get<std::string>();
  p.hbm_bytes = bytes_field(req("hbm"), src, "hbm");
  p.hbm_reserve = j.contains("hbm_reserve") ? bytes_field(j["hbm_reserve"], src, "hbm_reserve") : 0;
  p.dram_bytes = bytes_field(req("dram"), src, "dram");
  p.nvme_bytes = bytes_field(req("nvme"), src, "nvme");
  LT_CHECK(p.hbm_bytes > 0 && p.dram_bytes > 0 && p.nvme_bytes >= 0, "{}: hbm and dram must be positive, nvme >= 0", src);
  LT_CHECK(p.hbm_reserve >= 0 && p.hbm_reserve < p.hbm_bytes, "{}: hbm_reserve must be in [0, hbm), got {}", src,
           p.hbm_reserve);
  if (j.contains("workspace_tokens") || j.contains("workspace_bytes")) {
    p.workspace_bytes = bytes_field(req("workspace_bytes"), src, "workspace_bytes");
    p.workspace_tokens = bytes_field(req("workspace_tokens"), src, "workspace_tokens");
    LT_CHECK(p.workspace_tokens > 0, "{}: workspace_tokens must be positive, got {}", src, p.workspace_tokens);
  }
  if (j.contains("workspace_points")) {
    const json& a = j["workspace_points"];
    LT_CHECK(a.is_array(), "{}: 'workspace_points' must be an array of [tokens, bytes], got {}", src, a.dump());
    for (size_t i = 0; i < a.size(); ++i) {
      const json& e = a[i];
      LT_CHECK(e.is_array() && e.size() == 2 && e[0].is_number_integer() && e[1].is_number_integer() &&
                   e[0].get<int64_t>() > 0 && e[1].get<int64_t>() >= 0,
               "{}: workspace_points[{}] must be [tokens > 0, bytes >= 0], got {}", src, i, e.dump());
      p.workspace_points.emplace_back(e[0].get<int64_t>(), e[1].get<int64_t>());
      LT_CHECK(i == 0 || p.workspace_points[i].first > p.workspace_points[i - 1].first,
               "{}: workspace_points must be in ascending tokens, got {} after {}", src, p.workspace_points[i].first,
               p.workspace_points[i - 1].first);
    }
  }
  if (j.contains("nvme_dir")) {
    LT_CHECK(j["nvme_dir"].is_string(), "{}: 'nvme_dir' must be a string", src);
    p.nvme_dir = j["nvme_dir"].get<std::string>();
  }
  p.h2d_bw = num("h2d_gbps", kGB);
  p.d2h_bw = num("d2h_gbps", kGB);
  p.both_bw = num("both_gbps", kGB);
  LT_CHECK(p.both_bw >= std::max(p.h2d_bw, p.d2h_bw) - 1e-9 && p.both_bw <= p.h2d_bw + p.d2h_bw + 1e-9,
           "{}: both_gbps must be between max(h2d, d2h) and h2d + d2h, got {} (h2d {}, d2h {})", src, p.both_bw / kGB,
           p.h2d_bw / kGB, p.d2h_bw / kGB);
  p.nvme_read_bw = num("nvme_read_gbps", kGB);
  p.nvme_write_bw = num("nvme_write_gbps", kGB);
  p.host_mem_bw = num("host_mem_gbps", kGB);
  p.gemm_flops = num("gemm_tflops", kTF);
  p.attn_flops = num("attn_tflops", kTF);
  p.peak_flops = num("peak_tflops", kTF);
  p.opt_fp32_params_per_s = num("opt_fp32_mparams_per_s", kM);
  p.opt_8bit_params_per_s = num("opt_8bit_mparams_per_s", kM);
  if (j.contains("gpu_measured")) {
    LT_CHECK(j["gpu_measured"].is_boolean(), "{}: 'gpu_measured' must be a boolean", src);
    p.gpu_measured = j["gpu_measured"].get<bool>();
  }
  if (j.contains("scan_tflops")) p.scan_flops = num("scan_tflops", kTF);
  nvme_queue_fields(j, src, p);
  if (j.contains("head_timing")) {
    const json& h = j["head_timing"];
    const std::string where = src + ": head_timing";
    LT_CHECK(h.is_object(), "{}: expected an object with hidden, vocab, tokens and seconds, got {}", where, h.dump());
    for (auto& [k, v] : h.items())
      LT_CHECK(k == "hidden" || k == "vocab" || k == "tokens" || k == "seconds" || k == "sliced_seconds",
               "{}: unknown field '{}'", where, k);
    for (const char* k : {"hidden", "vocab", "tokens"})
      LT_CHECK(h.contains(k) && h[k].is_number_integer() && h[k].get<int64_t>() > 0,
               "{}: '{}' must be a positive integer, got {}", where, k, h.contains(k) ? h[k].dump() : "nothing");
    LT_CHECK(h.contains("seconds") && h["seconds"].is_number() && h["seconds"].get<double>() > 0,
             "{}: 'seconds' must be a positive number, got {}", where, h.contains("seconds") ? h["seconds"].dump() : "nothing");
    p.head = {h["hidden"].get<int64_t>(), h["vocab"].get<int64_t>(), h["tokens"].get<int64_t>(), h["seconds"].get<double>()};
    if (h.contains("sliced_seconds")) {
      LT_CHECK(h["sliced_seconds"].is_number() && h["sliced_seconds"].get<double>() > 0,
               "{}: 'sliced_seconds' must be a positive number, got {}", where, h["sliced_seconds"].dump());
      p.head.sliced_seconds = h["sliced_seconds"].get<double>();
    }
  }
  if (j.contains("layer_timings")) {
    const json& a = j["layer_timings"];
    LT_CHECK(a.is_array(), "{}: 'layer_timings' must be an array", src);
    for (size_t i = 0; i < a.size(); ++i)
      p.layer_timings.push_back(timing_from_json(a[i], fmt::format("{}: layer_timings[{}]", src, i)));
  }
  return p;
}

ResourceProfile load_profile_file(const std::filesystem::path& path) {
  std::ifstream f(path);
  LT_CHECK(f.good(), "cannot open profile {}", path.string());
  json j;
  try {
    j = json::parse(f);
  } catch (const json::parse_error& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
  return profile_from_json(j, path.string());
}

void save_profile(const ResourceProfile& p, const std::filesystem::path& path) {
  std::ofstream f(path);
  LT_CHECK(f.good(), "cannot write profile {}", path.string());
  f << profile_to_json(p).dump(2) << "\n";
}

namespace {
std::vector<std::filesystem::path> profile_dirs() {
  std::vector<std::filesystem::path> d;
  if (const std::string& e = plan_env().profile_dir; !e.empty()) d.emplace_back(e);
  d.emplace_back("configs/profiles");
  // Beside the binary's source tree: <repo>/build-*/bin/lazytrain -> <repo>/configs/profiles.
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (auto q = exe.parent_path(); !q.empty() && q != q.root_path(); q = q.parent_path())
      if (std::filesystem::exists(q / "configs/profiles")) {
        d.push_back(q / "configs/profiles");
        break;
      }
  }
  return d;
}
}  // namespace

std::vector<std::string> profile_preset_names() { return {"h800-80g", "rtx3090-24g", "h200"}; }

ResourceProfile resolve_profile(const std::string& s) {
  std::filesystem::path p(s);
  if (p.extension() == ".json" || s.find('/') != std::string::npos) return load_profile_file(p);
  for (auto& d : profile_dirs()) {
    auto f = d / (s + ".json");
    if (std::filesystem::exists(f)) return load_profile_file(f);
  }
  fail("unknown profile '{}': not a file and no preset configs/profiles/{}.json found (presets: h800-80g, rtx3090-24g, h200; "
       "set LT_PROFILE_DIR to the folder holding them)", s, s);
}

double backend_workspace_bytes(const ResourceProfile& p, int64_t tokens) {
  std::vector<std::pair<int64_t, int64_t>> pts = p.workspace_points;
  if (p.workspace_tokens > 0) pts.emplace_back(p.workspace_tokens, p.workspace_bytes);
  std::sort(pts.begin(), pts.end());
  if (pts.empty()) return 0;
  if (tokens <= pts.front().first) return double(pts.front().second) * double(tokens) / double(pts.front().first);
  for (size_t i = 1; i < pts.size(); ++i)
    if (tokens <= pts[i].first) {
      const auto [t0, b0] = pts[i - 1];
      const auto [t1, b1] = pts[i];
      return double(b0) + double(b1 - b0) * double(tokens - t0) / double(t1 - t0);
    }
  return double(pts.back().second) * double(tokens) / double(pts.back().first);
}

double core_flops_rate(const ResourceProfile& p, LayerKind k) {
  return k == LayerKind::GatedDeltaNet && p.scan_flops > 0 ? p.scan_flops : p.attn_flops;
}

double head_time(const ResourceProfile& p, const ModelConfig& c, int64_t batch, int64_t seq, bool sliced) {
  const bool measured = p.head.tokens > 0 && p.head.hidden == c.hidden && p.head.vocab == c.vocab;
  const double rows = measured ? double(batch * seq) / double(p.head.tokens) : 0;
  if (measured && sliced && p.head.sliced_seconds > 0) return p.head.sliced_seconds * rows;
  const double full = measured ? p.head.seconds * rows : 3.0 * head_flops_fwd(c, batch * seq) / p.gemm_flops;
  return sliced ? full * 4.0 / 3.0 : full;
}

LayerTimes layer_times(const ResourceProfile& p, const ModelConfig& c, LayerKind k, int64_t batch, int64_t seq,
                       int64_t chunk) {
  LayerTimes r;
  // The matching timings by sample count: the nearest at or below the chunk's size and the nearest above it.
  const double n = double(chunk > 0 && chunk < batch ? chunk : batch);
  const LayerTiming *lo = nullptr, *hi = nullptr;
  for (auto& t : p.layer_timings) {
    if (!timing_matches(t, c, k, seq)) continue;
    if (double(t.batch) <= n && (!lo || t.batch > lo->batch)) lo = &t;
    if (double(t.batch) > n && (!hi || t.batch < hi->batch)) hi = &t;
  }
  if (lo || hi) {
    // Same layer kind, shape and sequence: time per sample at the chunk's size, times the batch. Outside the
    // measured sizes the nearest one's per-sample time holds (above it, the GEMMs are saturated already).
    // Kept internals (bwd_kept_s, keep_bytes) the same way, at the same timings; 0 when one of them lacks it.
    struct PerSample {
      double f, b, bk, kb;
    };
    auto per_sample = [](const LayerTiming* t) {
      const double n = double(t->batch);
      return PerSample{t->fwd_s / n, t->bwd_s / n, t->bwd_kept_s / n, double(t->keep_bytes) / n};
    };
    PerSample x = per_sample(lo ? lo : hi);
    bool kept_ok = x.bk > 0, keep_ok = x.kb > 0;
    if (lo && hi) {
      const PerSample h = per_sample(hi);
      const double w = std::log(n / double(lo->batch)) / std::log(double(hi->batch) / double(lo->batch));
      x.f += w * (h.f - x.f);
      x.b += w * (h.b - x.b);
      x.bk += w * (h.bk - x.bk);
      x.kb += w * (h.kb - x.kb);
      kept_ok = kept_ok && h.bk > 0;
      keep_ok = keep_ok && h.kb > 0;
    }
    r.fwd_s = x.f * double(batch);
    r.bwd_s = x.b * double(batch);
    r.bwd_kept_s = kept_ok ? x.bk * double(batch) : 0.0;
    r.keep_bytes = keep_ok ? x.kb * double(batch) : 0.0;
    r.measured = true;
    return r;
  }
  const auto lc = layer_cost(c, k, batch, seq);
  const double core = lc.flops_core_fwd, mm = lc.flops_fwd - core;
  r.fwd_s = mm / p.gemm_flops + core / core_flops_rate(p, k);
  r.bwd_s = 2.0 * r.fwd_s;
  return r;
}

AttentionShare attention_share(const ResourceProfile& p, const ModelConfig& c, const LayerTimes& t, int64_t batch,
                               int64_t seq) {
  const double core_s = layer_cost(c, LayerKind::Attention, batch, seq).flops_core_fwd / p.attn_flops;
  const double bwd = t.measured ? 2.5 : 2.0;
  return {std::min(core_s, t.fwd_s), std::min(bwd * core_s, t.bwd_s), std::min(bwd * core_s, t.bwd_kept_s)};
}

LayerTimes packed_layer_times(const ResourceProfile& p, const ModelConfig& c, LayerKind k, int64_t batch, int64_t seq,
                              int64_t chunk, double attention_fraction) {
  LT_CHECK(attention_fraction > 0 && attention_fraction <= 1,
           "plan: the attention fraction (sum of segment len^2 / seq^2 per row) must be in (0, 1], got {}",
           attention_fraction);
  LayerTimes t = layer_times(p, c, k, batch, seq, chunk);
  if (k != LayerKind::Attention || attention_fraction == 1.0) return t;
  const AttentionShare s = attention_share(p, c, t, batch, seq);
  const double cut = 1.0 - attention_fraction;
  t.fwd_s -= cut * s.fwd_s;
  t.bwd_s -= cut * s.bwd_s;
  t.bwd_kept_s -= cut * s.bwd_kept_s;
  return t;
}

}  // namespace lt
