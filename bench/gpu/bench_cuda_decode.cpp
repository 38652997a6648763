// Greedy decoding with a KV cache on the GPU (src/infer/cuda/cuda_decoder.h): tokens/s of the decode
// steps and of the prefill, weights resident vs streamed, for real model shapes with random bf16
// weights (nothing stops early: every sequence generates --new tokens).
//
// Streamed mode uploads every layer once per pass through two device slots while the previous layer
// computes; the bench also times the uploads alone (copy stream, no compute) to report the PCIe
// bandwidth and how much of the compute the uploads hide: overlap = (resident step + upload-only pass -
// streamed step) / min(resident step, upload-only pass): 1 = the shorter of the two is fully hidden,
// 0 = they run one after the other.
//
//   bench_cuda_decode [--models qwen2.5-0.5b,qwen2.5-3b --batches 1,32,128 --prompt 128 --new 128
//                      --modes resident,eager,streamed --gpu-mem-gib 0 --json out.jsonl]
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "infer/cuda/cuda_decoder.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/units.h"

using namespace lt;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');)
    if (!t.empty()) out.push_back(t);
  return out;
}

// Random bf16 weights: matrices uniform with std 0.02 (a hash of unit and index), norms 1.
cuda::UnitSource random_units(const ModelLayout& layout) {
  return [&layout](int64_t u, uint16_t* dst) {
    const UnitLayout& ul = layout.units[size_t(u)];
    std::fill(dst, dst + ul.numel, uint16_t(0));
    for (const auto& p : ul.params) {
      const bool norm = p.suffix.find("norm") != std::string::npos;
      uint16_t* d = dst + p.offset;
      const int64_t n = p.numel;
      auto run = [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; ++i) {
          if (norm) {
            d[i] = f32_to_bf16(1.f);
            continue;
          }
          uint64_t h = (uint64_t(i) + 0x9E3779B97F4A7C15ull * uint64_t(u + 1) + uint64_t(p.offset)) * 0xBF58476D1CE4E5B9ull;
          h ^= h >> 31;
          const float r = float(h >> 40) / float(1 << 24) - 0.5f;  // uniform [-0.5, 0.5)
          d[i] = f32_to_bf16(r * 0.0693f);                         // std 0.02
        }
      };
      const int64_t th = std::clamp<int64_t>(n >> 22, 1, std::max(1u, std::thread::hardware_concurrency()));
      std::vector<std::thread> ts;
      for (int64_t t = 0; t < th; ++t) ts.emplace_back(run, n * t / th, n * (t + 1) / th);
      for (auto& t : ts) t.join();
    }
  };
}

struct Row {
  std::string model, mode;
  int64_t batch = 0;
  double prefill_s = 0, step_ms = 0, decode_tps = 0, total_tps = 0, device_gib = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPU greedy decoding throughput: resident vs streamed weights"};
  std::string models = "qwen2.5-0.5b,qwen2.5-3b", batches = "1,32,128", modes = "resident,eager,streamed", json;
  int64_t prompt = 128, new_tokens = 128;
  double gpu_mem_gib = 0;
  app.add_option("--models", models, "comma-separated presets");
  app.add_option("--batches", batches, "comma-separated batch sizes");
  app.add_option("--prompt", prompt, "prompt tokens per sequence");
  app.add_option("--new", new_tokens, "generated tokens per sequence");
  app.add_option("--modes", modes, "resident (decode steps as CUDA graphs), eager (resident, kernels launched one by one), streamed");
  app.add_option("--gpu-mem-gib", gpu_mem_gib, "GPU memory cap (0: free memory)");
  app.add_option("--json", json, "append one JSON line per row");
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<int64_t> bs;
    for (auto& b : split(batches)) bs.push_back(std::stoll(b));
    const int64_t max_b = *std::max_element(bs.begin(), bs.end());
    std::vector<Row> rows;
    std::vector<std::string> notes;
    std::ofstream js;
    if (!json.empty()) js.open(json, std::ios::app);
    for (const std::string& name : split(models)) {
      const ModelConfig c = preset_config(name);
      const ModelLayout layout = model_layout(c);
      std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(max_b), std::vector<int32_t>(static_cast<size_t>(prompt)));
      for (size_t i = 0; i < prompts.size(); ++i)
        for (size_t t = 0; t < prompts[i].size(); ++t)
          prompts[i][t] = int32_t((uint64_t(i * 7919 + t) * 2654435761u) % uint64_t(c.vocab));
      std::vector<double> resident_step_ms(bs.size(), 0.0);  // eager resident steps (streamed ones launch eagerly too)
      for (const std::string& mode_s : split(modes)) {
        cuda::DecoderOptions o;
        const bool eager = mode_s == "eager";
        o.weights = eager ? WeightsMode::Resident : parse_weights_mode(mode_s);
        o.cuda_graphs = !eager;
        o.max_batch = max_b;
        o.max_seq = prompt + new_tokens;
        o.gpu_mem_cap = int64_t(gpu_mem_gib * double(GiB));
        cuda::CudaDecoder dec(c, layout, random_units(layout), o);
        fmt::print("{}: {}\n", name, dec.describe());
        double upload_ms = 0;
        if (dec.mode() == WeightsMode::Streamed) {
          dec.time_uploads_only(1);  // warm-up
          upload_ms = dec.time_uploads_only(3) / 3 * 1e3;
          const double gbs = double(dec.streamed_bytes_per_pass()) / (upload_ms / 1e3) / 1e9;
          notes.push_back(fmt::format("{}: streamed {} of layers per pass; uploads alone {:.2f} ms per pass = {:.1f} GB/s",
                                      name, format_bytes(double(dec.streamed_bytes_per_pass())), upload_ms, gbs));
          fmt::print("  {}\n", notes.back());
        }
        for (size_t bi = 0; bi < bs.size(); ++bi) {
          const int64_t b = bs[bi];
          std::vector<std::vector<int32_t>> p(prompts.begin(), prompts.begin() + b);
          dec.generate(p, 4, b, {});  // warm-up: cuBLASLt plans, caches
          dec.reset_counters();
          dec.generate(p, new_tokens, b, {});
          const cuda::DecodeCounters& k = dec.counters();
          Row r;
          r.model = name;
          r.mode = std::string(weights_mode_name(dec.mode())) + (dec.uses_graphs() ? " (graphs)" : dec.mode() == WeightsMode::Resident ? " (eager)" : "");
          r.batch = b;
          r.prefill_s = k.prefill_seconds;
          r.step_ms = k.decode_seconds / double(std::max<int64_t>(1, new_tokens - 1)) * 1e3;
          r.decode_tps = k.decode_seconds > 0 ? double(k.generated_tokens - k.sequences) / k.decode_seconds : 0;
          r.total_tps = double(k.generated_tokens) / (k.prefill_seconds + k.decode_seconds);
          r.device_gib = double(dec.device_bytes()) / double(GiB);
          rows.push_back(r);
          std::string overlap;
          if (dec.mode() == WeightsMode::Resident) {
            if (!dec.uses_graphs() || resident_step_ms[bi] == 0) resident_step_ms[bi] = r.step_ms;
          } else if (resident_step_ms[bi] > 0) {
            const double rs = resident_step_ms[bi];
            const double ov = (rs + upload_ms - r.step_ms) / std::min(rs, upload_ms);
            overlap = fmt::format("; resident eager step {:.2f} ms, upload-only {:.2f} ms -> overlap {:.2f} ({})", rs,
                                  upload_ms, ov,
                                  r.step_ms <= 1.1 * std::max(rs, upload_ms) ? "compute hidden under the upload"
                                                                              : "not hidden");
            notes.push_back(fmt::format("{} batch {}: streamed step {:.2f} ms{}", name, b, r.step_ms, overlap));
          }
          fmt::print("  batch {:4d}: prefill {:.3f} s ({:.0f} tokens/s), decode step {:.2f} ms, {:.0f} tokens/s{}\n", b,
                     r.prefill_s, double(k.prompt_tokens) / std::max(1e-9, r.prefill_s), r.step_ms, r.decode_tps,
                     overlap);
          if (js.is_open())
            js << fmt::format(
                "{{\"model\":\"{}\",\"mode\":\"{}\",\"batch\":{},\"prompt\":{},\"new\":{},\"prefill_s\":{:.4f},"
                "\"step_ms\":{:.4f},\"decode_tokens_per_s\":{:.1f},\"tokens_per_s\":{:.1f},\"device_gib\":{:.3f},"
                "\"upload_only_ms\":{:.3f}}}\n",
                name, r.mode, b, prompt, new_tokens, r.prefill_s, r.step_ms, r.decode_tps, r.total_tps, r.device_gib,
                upload_ms);
        }
      }
    }
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    fmt::print("\nGPU greedy decoding on {} (prompt {}, {} new tokens per sequence, random bf16 weights)\n", prop.name,
               prompt, new_tokens);
    fmt::print("| model | weights | batch | prefill s | decode step ms | decode tokens/s | tokens/s incl. prefill | device GiB |\n");
    fmt::print("|---|---|---|---|---|---|---|---|\n");
    for (const Row& r : rows)
      fmt::print("| {} | {} | {} | {:.3f} | {:.2f} | {:.0f} | {:.0f} | {:.2f} |\n", r.model, r.mode, r.batch, r.prefill_s,
                 r.step_ms, r.decode_tps, r.total_tps, r.device_gib);
    for (const auto& n : notes) fmt::print("{}\n", n);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_cuda_decode: {}\n", e.what());
    return 1;
  }
  return 0;
}
