// `lazytrain profile -o profile.json`: measure this machine for the planner. Host memory bandwidth,
// NVMe O_DIRECT write/read bandwidth and 4 KiB read latency on --nvme-dir, CPU AdamW throughput (the optimizer's
// own kernels, fp32 and 8-bit moments); GPU fields through the CUDA backend's registered profiler, else from --preset.
#include <cstdio>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "core/timer.h"
#include "core/units.h"
#include "model/model_config.h"
#include "optim/throughput.h"
#include "plan/profile.h"
#ifdef LT_HAVE_CUDA
#include "plan/cuda/gpu_profiler.h"
#endif

namespace lt::cli {

using namespace lt::optim;

void add_profile(CLI::App& app) {
  struct Opts {
    std::string out = "profile.json", preset = "h200", nvme_dir = "/tmp/lazytrain-nvme", name, model = "qwen2.5-7b";
    std::string nvme_bytes = "512MiB", host_mem;
    int threads = 0;
    int64_t batch = 8, seq = 1024;
    bool skip_nvme = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("profile", "Measure this machine (host memory, NVMe, CPU optimizer; GPU via the CUDA backend)");
  sub->add_option("-o,--output", o->out, "profile JSON to write")->capture_default_str();
  sub->add_option("--preset", o->preset, "profile whose fields are kept where nothing is measured")->capture_default_str();
  sub->add_option("--nvme-dir", o->nvme_dir, "directory for NVMe checkpoints (measured with O_DIRECT)")->capture_default_str();
  sub->add_option("--nvme-bytes", o->nvme_bytes, "bytes written and read back for the NVMe measurement")->capture_default_str();
  sub->add_option("--host-mem", o->host_mem, "DRAM budget to record (default: 90% of MemAvailable)");
  sub->add_option("--threads", o->threads, "CPU threads (default: all)");
  sub->add_option("--model", o->model, "model whose layer times the GPU profiler measures")->capture_default_str();
  sub->add_option("--batch", o->batch, "batch for the GPU layer timing")->capture_default_str();
  sub->add_option("--seq", o->seq, "sequence length for the GPU layer timing")->capture_default_str();
  sub->add_option("--name", o->name, "profile name (default: measured-<preset>)");
  sub->add_flag("--skip-nvme", o->skip_nvme, "keep the preset's NVMe figures");
  sub->callback([o] {
    const double t0 = now_seconds();
    auto say = [&](const std::string& m) { std::fprintf(stderr, "[%5.1fs] %s\n", now_seconds() - t0, m.c_str()); };
    ResourceProfile p = resolve_profile(o->preset);
    const int threads = o->threads > 0 ? o->threads : int(std::max(1u, std::thread::hardware_concurrency()));
    p.name = o->name.empty() ? "measured-" + p.name : o->name;
    std::string src = fmt::format("measured by `lazytrain profile` with {} threads: host memory, NVMe ({}), CPU AdamW", threads,
                                  o->nvme_dir);

    p.host_mem_bw = measure_host_bandwidth(threads, 256 * MiB, say);
    say(fmt::format("  host memory {:.1f} GB/s (read+write)", p.host_mem_bw / 1e9));
    p.dram_bytes = !o->host_mem.empty() ? parse_bytes(o->host_mem) : int64_t(0.9 * double(mem_available_bytes()));
    say(fmt::format("  DRAM budget {}", format_bytes(double(p.dram_bytes))));

    if (!o->skip_nvme) {
      auto nv = measure_nvme(o->nvme_dir, parse_bytes(o->nvme_bytes), say);
      p.nvme_write_bw = nv.write_bw;
      p.nvme_read_bw = nv.read_bw;
      p.nvme_latency_s = nv.latency_s;
      p.nvme_bytes = int64_t(0.9 * double(nv.free_bytes));
      p.nvme_dir = o->nvme_dir;
      say(fmt::format("  NVMe write {:.2f} GB/s, read {:.2f} GB/s, latency {:.0f} us (4 KiB read){}, {} free",
                      nv.write_bw / 1e9, nv.read_bw / 1e9, nv.latency_s * 1e6, nv.direct ? "" : " (buffered: O_DIRECT refused)",
                      format_bytes(double(nv.free_bytes))));
      if (!nv.direct) src += " [NVMe buffered, O_DIRECT refused]";
    }

    for (bool q8 : {false, true}) {
      say(fmt::format("CPU optimizer: AdamW {} over 64M params (the optimizer's pool, split masters)", q8 ? "8-bit" : "fp32"));
      const double r = optim::measure_optimizer_rate(q8, threads, 64 << 20);
      (q8 ? p.opt_8bit_params_per_s : p.opt_fp32_params_per_s) = r;
      say(fmt::format("  {:.0f} Mparams/s", r / 1e6));
    }

#ifdef LT_HAVE_CUDA
    cuda::install_gpu_profiler();
#endif
    if (auto gp = gpu_profiler()) {
      say(fmt::format("GPU: measuring through the CUDA backend ({} batch {} seq {})", o->model, o->batch, o->seq));
      gp(p, resolve_model(o->model), o->batch, o->seq);
      p.gpu_measured = true;
      src += "; GPU measured through the CUDA backend";
    } else {
      say(fmt::format("GPU: not measured (no CUDA backend in this build); HBM, PCIe and GEMM figures taken from preset '{}'",
                      o->preset));
      p.gpu_measured = false;
      src += fmt::format("; GPU fields NOT measured, taken from preset {} ({})", o->preset, p.source);
    }
    p.source = src;
    save_profile(p, o->out);
    say(fmt::format("wrote {}", o->out));
  });
}

}  // namespace lt::cli
