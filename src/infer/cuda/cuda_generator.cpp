// The CUDA decoder as a train::Generator, and the hooks through which the decoding commands and the trainer's
// final evaluation reach it.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <map>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/units.h"
#include "infer/cuda/cuda_decoder.h"
#include "infer/gpu_decode.h"

namespace lt::infer {
namespace {

class CudaGenerator final : public train::Generator {
 public:
  CudaGenerator(const train::ModelWeightsView& w, const train::DecodeDeviceOptions& o, Backend* borrow) {
    cuda::DecoderOptions d;
    d.gpu_mem_cap = int64_t(o.gpu_mem_gib * double(GiB));
    d.weights = o.weights;
    d.max_batch = o.max_batch;
    d.max_seq = o.max_seq;
    // The one environment switch of GPU decoding: LT_DECODE_GRAPHS=0 replays no CUDA graphs.
    const char* graphs = std::getenv("LT_DECODE_GRAPHS");
    d.cuda_graphs = !(graphs && std::string(graphs) == "0");
    if (borrow) {
      // Evaluation after CUDA training: the backend's arena holds (nearly) all device memory; the
      // decoder takes its share from it.
      LT_CHECK(dynamic_cast<CudaBackend*>(borrow) != nullptr, "internal: GPU decoding can only borrow from the CUDA backend");
      MemoryTracker& mt = borrow->memory();
      d.memory.available = mt.budget(MemKind::Device) - mt.current(MemKind::Device);
      d.memory.alloc = [this, borrow](int64_t bytes, const char* tag) {
        Allocation a = borrow->alloc(MemKind::Device, bytes, tag);
        void* p = a.ptr;
        allocs_[p] = a;
        return p;
      };
      d.memory.release = [this, borrow](void* p) {
        auto it = allocs_.find(p);
        if (it == allocs_.end()) return;
        borrow->free(it->second);
        allocs_.erase(it);
      };
    }
    dec_ = std::make_unique<cuda::CudaDecoder>(*w.cfg, *w.layout, cuda::fp32_units(*w.layout, w.units), d);
  }
  std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                             const train::GenerateOptions& opt) override {
    return dec_->generate(prompts, opt.max_new_tokens, opt.batch_size, opt.stop_ids);
  }
  std::string describe() const override { return dec_->describe(); }
  train::DecodeStats stats() const override {
    const cuda::DecodeCounters& c = dec_->counters();
    train::DecodeStats s;
    s.sequences = c.sequences;
    s.prompt_tokens = c.prompt_tokens;
    s.generated_tokens = c.generated_tokens;
    s.prefill_seconds = c.prefill_seconds;
    s.decode_seconds = c.decode_seconds;
    return s;
  }

 private:
  std::map<void*, Allocation> allocs_;      // borrowed device memory (destroyed after dec_)
  std::unique_ptr<cuda::CudaDecoder> dec_;
};

}  // namespace

bool cuda_device_count_positive() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

train::GpuDecodeHooks cuda_decode_hooks() {
  train::GpuDecodeHooks h;
  h.gpu_visible = cuda_device_count_positive;
  h.make = [](const train::ModelWeightsView& w, const train::DecodeDeviceOptions& o,
              Backend* borrow) -> std::unique_ptr<train::Generator> {
    return std::make_unique<CudaGenerator>(w, o, borrow);
  };
  h.unsupported = [](const ModelConfig& c) { return cuda::decoder_unsupported(c); };
  return h;
}

}  // namespace lt::infer
