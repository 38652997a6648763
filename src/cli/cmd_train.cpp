// `lazytrain train config.yaml [key=value ...]`: see src/train/config.h for the keys and docs/training.md.
#include <cstdio>

#include "cli/commands.h"
#include "infer/gpu_decode.h"
#include "core/error.h"
#include "train/config.h"
#include "train/trainer.h"

#ifdef LT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#include "plan/cuda/gpu_profiler.h"
#include "core/units.h"
#endif
#ifdef LT_HAVE_NCCL
#include "dist/nccl/nccl_comm.h"
#include "dist/shm_comm.h"
#endif

namespace lt::cli {
namespace {

train::BackendChoice make_backend(const ModelConfig& m, const train::TrainConfig& c, int64_t device_budget,
                                  int64_t host_budget) {
#ifdef LT_HAVE_CUDA
  const bool have_gpu = infer::cuda_device_visible();
  if (c.placement.backend == train::BackendKind::Cuda) LT_CHECK(have_gpu, "backend: 'cuda' requested but no CUDA device is visible");
  if (have_gpu && c.placement.backend != train::BackendKind::Cpu) {
    CudaBackendOptions o;
    o.gpu_mem_cap = device_budget > 0 ? device_budget : 0;
    train::BackendChoice b;
    b.backend = std::make_unique<CudaBackend>(m, o);
    b.device_name = b.backend->name();
    b.gpu = true;
    return b;
  }
#endif
  return train::make_cpu_backend(m, c, device_budget, host_budget);
}

train::DeviceProbe probe_device(const train::TrainConfig& c) {
  train::DeviceProbe p;
#ifdef LT_HAVE_CUDA
  const bool have_gpu = infer::cuda_device_visible();
  if (c.placement.backend == train::BackendKind::Cuda) LT_CHECK(have_gpu, "backend: 'cuda' requested but no CUDA device is visible");
  if (have_gpu && c.placement.backend != train::BackendKind::Cpu) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    p.gpu = true;
    p.name = prop.name;
    cuda::install_gpu_profiler();  // the planner measures PCIe, GEMM and layer times on this GPU
  }
#else
  (void)c;
#endif
  return p;
}

#ifdef LT_HAVE_NCCL
// A data-parallel rank on a GPU: NCCL over this host's GPUs (the rank uses GPU env.local_rank);
// on the CPU backend the shared-memory communicator.
std::unique_ptr<dist::Communicator> make_communicator(const dist::DistEnv& env, const train::TrainConfig& c) {
  if (infer::cuda_device_visible() && c.placement.backend != train::BackendKind::Cpu) return dist::NcclCommunicator::create(env);
  dist::ShmCommOptions o;
  o.timeout_s = dist::comm_timeout_from_environment();
  return dist::ShmCommunicator::create(env, o);
}
#endif

}  // namespace

void add_train(CLI::App& app) {
  auto* sub = app.add_subcommand("train", "Train a model: lazytrain train config.yaml [key=value ...]");
  auto config = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  auto print_only = std::make_shared<bool>(false);
  sub->add_option("config", *config, "YAML config (keys: docs/training.md)")->required();
  sub->add_option("overrides", *overrides, "key=value overrides applied after the file");
  sub->add_flag("--print-config", *print_only, "print the effective config and exit");
  auto trace = std::make_shared<std::string>();
  sub->add_option("--trace", *trace, "write a Chrome/Perfetto trace of one step (config key trace_step, default 2)");
  sub->callback([=] {
    std::vector<std::string> ov = *overrides;
    if (!trace->empty()) ov.push_back("trace=" + *trace);
    train::TrainConfig c = train::load_config(*config, ov);
    if (*print_only) {
      std::printf("%s\n", train::config_to_yaml(c).c_str());
      return;
    }
    train::TrainHooks hooks;
    hooks.make_backend = make_backend;
    hooks.probe_device = probe_device;
    hooks.gpu_decode = infer::gpu_decode_hooks();
#ifdef LT_HAVE_NCCL
    hooks.make_communicator = make_communicator;
#endif
    train::TrainResult r = train::run_training(c, hooks);
    if (r.interrupted) throw CLI::RuntimeError(130);
  });
}

}  // namespace lt::cli
