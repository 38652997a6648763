// CPU backend: the Backend interface on the host, for tests and for machines without a GPU.
// One worker thread per lane stands in for a stream; "device" memory is host memory with the same
// budget enforcement; ops are the fp32 reference (reference.h), so every dtype is F32 (the streaming
// copy of the weights is then fp32 too). Optional bandwidth emulation makes copies take
// bytes / bandwidth seconds, so overlap and exposed time can be studied without a GPU.
// With a device budget, device allocations are also placed in a model of the CUDA backend's arena of that size
// (ArenaAllocator, offsets only): a sequence of allocations and releases whose free bytes end up in pieces too
// small for a request fails here as on the GPU ("device arena exhausted"), not only one over the budget. The ops
// take their workspace as the CUDA backend's do (grown at the call that needs more unless a run holds it), sized
// by what the reference allocates.
#pragma once
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "backend/arena_allocator.h"
#include "backend/backend.h"

namespace lt {

struct CpuBackendOptions {
  int64_t device_budget = MemoryTracker::kUnlimited;
  int64_t pinned_budget = MemoryTracker::kUnlimited;
  double h2d_bytes_per_s = 0;  // 0: as fast as memcpy
  double d2h_bytes_per_s = 0;
  int threads = 0;  // OpenMP threads of the compute lane's ops; 0 = omp_get_max_threads() of the constructing thread
};

class CpuBackend : public Backend {  // not final: tests spy on it
 public:
  explicit CpuBackend(const ModelConfig& c, CpuBackendOptions o = {});
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  BackendDTypes dtypes() const override { return {DType::F32, DType::F32, DType::F32}; }

  Allocation alloc(MemKind k, int64_t bytes, const std::string& tag) override;
  void free(Allocation& a) override;
  int64_t layer_workspace_bytes(int64_t tokens, int64_t seq = 0) const override;
  void reserve_workspace(int64_t tokens, int64_t seq = 0) override;
  void hold_workspace(int64_t bytes) override;
  void release_workspace() override;
  // The arena model (null without a device budget).
  const ArenaAllocator* device_arena() const { return arena_.get(); }

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
  // Kept internals: the reference keeps nothing it could reuse (it re-runs the forward in every backward), so
  // its kept buffer holds only a record of the forward (layer, geometry, x, w) that the kept backward checks and
  // consumes: a plan's kept layers run through the executor's kept path here too, and a wrong or stale buffer
  // is an error.
  int64_t layer_keep_bytes(int64_t layer, int64_t batch, int64_t seq) const override;
  void layer_forward_keep(int64_t layer, const void* w, const DevGeometry& g, const void* x, void* y, void* keep,
                          OpLabel l) override;
  void layer_backward_kept(int64_t layer, const void* w, const DevGeometry& g, const void* x, const void* dy,
                           void* dx, void* dw, void* keep, OpLabel l) override;
  void head_loss(const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g,
                 const void* x, float loss_scale, void* dx, void* d_head_w, void* d_lm_w, double* acc,
                 OpLabel l) override;
  void head_logits(const void* head_w, const void* lm_w, const void* x, const int64_t* rows, int64_t n_rows,
                   float* out, OpLabel l) override;
  bool has_sliced_head_grad() const override { return true; }
  void head_loss_lse(const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g, const void* x,
                     float loss_scale, void* dx, void* d_norm_w, float* lse, double* acc, OpLabel l) override;
  void head_lm_grad_slice(const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g,
                          const void* x, const float* lse, float loss_scale, int64_t v0, int64_t n_v, void* dw,
                          OpLabel l) override;
  void embed_backward_acc(const int32_t* ids, int64_t T, const void* dx, void* acc, DType acc_dtype, double* sumsq,
                          OpLabel l) override;
  void grad_sumsq(const void* grad, int64_t n, double* out, OpLabel l) override;
  void grad_add(void* acc, DType acc_dtype, const void* grad, int64_t n, double* sumsq, OpLabel l) override;
  void adamw_step(const AdamWStepScalars& s, float* p, bf16_t* hi, uint16_t* lo, const float* g, float* m, float* v,
                  int64_t n, OpLabel l) override;
  void adamw_step_q8(const AdamWStepScalars& s, const Q8Maps& maps, float* p, bf16_t* hi, uint16_t* lo, const float* g,
                     uint8_t* mq, uint8_t* vq, float* ms, float* vs, int64_t n, OpLabel l) override;

  // Test hook: the next `n`-th op enqueued on `lane` (counting from 1) throws this message.
  void inject_failure(Lane lane, int64_t nth, const std::string& msg);

  struct Impl;

 private:
  // The workspace the reference's layer call on `tokens` rows, and its head on one sample of `seq` rows, allocate.
  int64_t layer_call_workspace(int64_t tokens) const;
  int64_t head_call_workspace(int64_t seq) const;
  void take_workspace(int64_t bytes);
  void free_workspace();
  // At least `bytes` of workspace when enqueueing `op` (label l, on `rows` rows), as the CUDA backend's ops take
  // theirs. A failure is the compute lane's error, reported by the next check() as a failed op's (the lane then
  // skips the op).
  void workspace_for(int64_t bytes, const char* op, OpLabel l, int64_t rows);
  void push_head_samples(const char* op, const DevGeometry& g, OpLabel l, std::function<void(int64_t)> fn);

  CpuBackendOptions opt_;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<ArenaAllocator> arena_;
  int64_t ws_bytes_ = 0, ws_offset_ = -1;  // the workspace (counted, and placed in arena_ when there is one)
  bool ws_held_ = false;
  // Live allocations by start address, so that a copy running past the end of the allocation it starts
  // in fails here as it does on the GPU (the CUDA runtime checks device ranges), not silently.
  struct Live {
    int64_t bytes = 0;
    std::string tag;
    int64_t arena_offset = -1;  // device allocations with an arena model
  };
  std::map<uintptr_t, Live> live_;
  void check_range(const void* p, int64_t bytes, const char* what, OpLabel l) const;
};

}  // namespace lt
