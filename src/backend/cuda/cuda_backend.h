// CUDA backend: the Backend interface (src/backend/backend.h) on one NVIDIA GPU.
//  * dtypes: activations bf16, streamed weights bf16, weight gradients fp32.
//  * Lanes are three non-blocking CUDA streams; events are CUDA events.
//  * Device memory: one arena of (gpu_mem_cap - margin) bytes taken at start; every allocation,
//    the layer/head workspace and the cuBLASLt workspace come from it, so --gpu-mem is a hard cap
//    (the CUDA context and cuBLAS handle state sit in the margin). The MemoryTracker's device budget
//    starts at the arena size; the executor may lower it.
//  * Pinned memory: mmap + cudaHostRegister per allocation; failures name the limits in force.
//  * Ops run the kernels of kernels.h through LayerEngine (layer.h).
#pragma once
#include <memory>
#include <optional>

#include "backend/backend.h"
#include "backend/cuda/kernel_options.h"

namespace lt {

struct CudaBackendOptions {
  int device = 0;
  int64_t gpu_mem_cap = 0;  // bytes; 0: the GPU's free memory
  int64_t margin = int64_t(768) << 20;  // kept outside the arena: CUDA context growth, cuBLAS handles, modules
  int64_t pinned_budget = MemoryTracker::kUnlimited;
  // The kernel variants; unset: cuda::kernel_options() (KernelOptions::from_environment() unless a test or
  // benchmark installed others). The backend installs its value process-wide (kernel_options.h).
  std::optional<cuda::KernelOptions> kernels;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const ModelConfig& c, CudaBackendOptions o = {});
  ~CudaBackend() override;

  std::string name() const override;
  std::string describe_kernels() const override;  // KernelOptions::describe()
  const cuda::KernelOptions& kernel_options() const;
  BackendDTypes dtypes() const override { return {DType::BF16, DType::BF16, DType::F32}; }

  Allocation alloc(MemKind k, int64_t bytes, const std::string& tag) override;
  void free(Allocation& a) override;
  int64_t layer_workspace_bytes(int64_t tokens, int64_t seq = 0) const override;
  void reserve_workspace(int64_t tokens, int64_t seq = 0) override;
  int64_t embed_workspace_bytes(int64_t tokens) const override;
  void hold_workspace(int64_t bytes) override;
  void release_workspace() override;
  void prepare_geometry(const DevGeometry& g) override;

  Event record(Lane lane) override;
  void wait(Lane lane, const Event& ev) override;
  void host_wait(const Event& ev) override;
  bool done(const Event& ev) override;
  void synchronize() override;
  void check() override;
  void clear_error() override;

  void copy(Lane lane, void* dst, const void* src, int64_t bytes, OpLabel l) override;
  void fill_zero(Lane lane, void* dst, int64_t bytes, OpLabel l) override;

  void set_timing(bool on) override;
  std::vector<Span> take_spans() override;

  void embed_forward(const void* emb, const int32_t* ids, int64_t T, void* x, OpLabel l) override;
  void embed_backward(const int32_t* ids, int64_t T, const void* dx, void* demb, OpLabel l) override;
  void layer_forward(int64_t layer, const void* w, const DevGeometry& g, const void* x, void* y,
                     OpLabel l) override;
  void layer_backward(int64_t layer, const void* w, const DevGeometry& g, const void* x, const void* dy,
                      void* dx, void* dw, OpLabel l) override;
  int64_t layer_keep_bytes(int64_t layer, int64_t batch, int64_t seq) const override;
  void layer_forward_keep(int64_t layer, const void* w, const DevGeometry& g, const void* x, void* y, void* keep,
                          OpLabel l) override;
  void layer_backward_kept(int64_t layer, const void* w, const DevGeometry& g, const void* x, const void* dy,
                           void* dx, void* dw, void* keep, OpLabel l) override;
  void head_loss(const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g,
                 const void* x, float loss_scale, void* dx, void* d_head_w, void* d_lm_w, double* acc,
                 OpLabel l) override;
  bool has_sliced_head_grad() const override { return true; }
  void head_loss_lse(const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g, const void* x,
                     float loss_scale, void* dx, void* d_norm_w, float* lse, double* acc, OpLabel l) override;
  void head_lm_grad_slice(const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g,
                          const void* x, const float* lse, float loss_scale, int64_t v0, int64_t n_v, void* dw,
                          OpLabel l) override;
  void embed_backward_acc(const int32_t* ids, int64_t T, const void* dx, void* acc, DType acc_dtype, double* sumsq,
                          OpLabel l) override;
  void head_logits(const void* head_w, const void* lm_w, const void* x, const int64_t* rows, int64_t n_rows,
                   float* out, OpLabel l) override;
  void grad_sumsq(const void* grad, int64_t n, double* out, OpLabel l) override;
  void grad_add(void* acc, DType acc_dtype, const void* grad, int64_t n, double* sumsq, OpLabel l) override;
  void adamw_step(const AdamWStepScalars& s, float* p, bf16_t* hi, uint16_t* lo, const float* g, float* m, float* v,
                  int64_t n, OpLabel l) override;
  void adamw_step_q8(const AdamWStepScalars& s, const Q8Maps& maps, float* p, bf16_t* hi, uint16_t* lo, const float* g,
                     uint8_t* mq, uint8_t* vq, float* ms, float* vs, int64_t n, OpLabel l) override;

  // Beyond the interface (tests, benches, profiler).
  int64_t arena_bytes() const;
  int64_t arena_peak() const;
  void* stream(Lane lane) const;  // cudaStream_t
  int64_t head_chunk_rows() const;
  void set_head_chunk_rows(int64_t rows);
  // The most rows one MLP pass of a layer call takes (LayerEngine::set_mlp_pass_bound; 0: the model's bound).
  void set_mlp_pass_bound(int64_t rows);

  struct Impl;

 private:
  void enqueue_head(const char* op, const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g,
                    const void* x, float loss_scale, void* dx, float* d_norm_w, float* d_lm_w, float* lse, double* acc,
                    OpLabel l);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lt
