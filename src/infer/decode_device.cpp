#include "infer/decode_device.h"

#include "core/error.h"
#include "core/log.h"

namespace lt::train {

DecodeDevice parse_decode_device(const std::string& s) {
  if (s == "auto") return DecodeDevice::Auto;
  if (s == "cpu") return DecodeDevice::Cpu;
  if (s == "cuda" || s == "gpu") return DecodeDevice::Cuda;
  fail("--device '{}': expected auto, cpu or cuda", s);
}

const char* decode_device_name(DecodeDevice d) {
  switch (d) {
    case DecodeDevice::Auto: return "auto";
    case DecodeDevice::Cpu: return "cpu";
    case DecodeDevice::Cuda: return "cuda";
  }
  return "?";
}

DecodeDevice resolve_decode_device(DecodeDevice device, const GpuDecodeHooks& gpu) {
  if (device == DecodeDevice::Cpu) return DecodeDevice::Cpu;
  if (device == DecodeDevice::Cuda) {
    LT_CHECK(gpu.built(),
             "--device cuda: this lazytrain was built without the CUDA backend (nvcc was not found when it was "
             "configured); use --device cpu or rebuild with the CUDA toolkit");
    LT_CHECK(gpu.gpu_visible(), "--device cuda: no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES); "
                                "use --device cpu");
    return DecodeDevice::Cuda;
  }
  return gpu.built() && gpu.gpu_visible() ? DecodeDevice::Cuda : DecodeDevice::Cpu;
}

std::unique_ptr<Generator> make_generator(const ModelWeightsView& w, const DecodeDeviceOptions& o,
                                          const GpuDecodeHooks& gpu, Backend* borrow) {
  LT_CHECK(o.gpu_mem_gib >= 0, "--gpu-mem {}: expected a size in GiB >= 0", o.gpu_mem_gib);
  if (resolve_decode_device(o.device, gpu) == DecodeDevice::Cuda) {
    const std::string why = gpu.unsupported_reason(*w.cfg);
    if (why.empty()) return gpu.make(w, o, borrow);
    LT_CHECK(o.device != DecodeDevice::Cuda, "--device cuda: {}; use --device cpu", why);
    log_info("decoding on the CPU: {}", why);
    return make_cpu_generator(w);
  }
  if (o.weights != WeightsMode::Auto || o.gpu_mem_gib > 0)
    log_warn("decoding on the CPU: --weights and --gpu-mem apply to CUDA decoding only and are ignored");
  return make_cpu_generator(w);
}

}  // namespace lt::train
