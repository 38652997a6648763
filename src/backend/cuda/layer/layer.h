// Decoder layer, embedding and head on the GPU, composed from the kernels and cuBLASLt GEMMs.
// Semantics follow src/backend/cpu/reference.h: activations bf16 [T, hidden], weights one flat bf16
// buffer in UnitLayout order, weight gradients fp32 in the same layout, ACCUMULATED (+=).
// layer_backward recomputes the layer's internals from x, unless its forward kept them (keep buffers).
// Everything is enqueued on one stream.
// A layer = the part every kind shares (RMSNorms, scaled by (1 + w) when norm_plus_one; residuals;
// SwiGLU MLP), here, + the token mixer of its kind (mixer.h), dispatched on c.kind(lay.layer).
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>

#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/kernel_options.h"
#include "backend/cuda/layer/mixer.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt::cuda {

class LayerEngine {
 public:
  // Needs a device fp32 array for inv_freq (rotary_dim/2 floats) and the GEMM object; workspace is
  // handed in per call (at least workspace_bytes(T) bytes, 256-byte aligned). Throws lt::Error naming
  // the piece when a layer kind of c cannot run on the GPU. k: the backend's kernel options (its mixers' paths,
  // the finiteness probes).
  LayerEngine(const ModelConfig& c, Gemm& gemm, const float* inv_freq_dev, const KernelOptions& k);
  ~LayerEngine();

  // The largest over the layer kinds present, for batch x seq rows.
  int64_t layer_workspace_bytes(int64_t batch, int64_t seq) const;
  // For T rows in samples whose length is unknown: as one sample of T rows. Exact for every kind when
  // the sample length is a multiple of 64 (Gated DeltaNet keeps one state per 64-row chunk of a sample);
  // the backend sizes each call by its geometry and grows the workspace when needed.
  int64_t layer_workspace_bytes(int64_t T) const { return layer_workspace_bytes(1, T); }
  int64_t head_workspace_bytes(int64_t T) const;
  int64_t embed_workspace_bytes(int64_t T) const;
  int64_t head_chunk_rows() const { return head_chunk_; }
  void set_head_chunk_rows(int64_t r) { head_chunk_ = r; }
  // The most rows one MLP pass takes (mlp_pass_rows' bound); 0: mlp_pass_bound (tests set fewer).
  void set_mlp_pass_bound(int64_t rows) { mlp_bound_ = rows; }

  // Bytes a layer of lay's kind keeps from its forward for its backward (kept internals, mixer.h).
  int64_t layer_keep_bytes(const UnitLayout& lay, int64_t batch, int64_t seq) const;

  // keep (layer_keep_bytes, 256-byte aligned) or null: the forward leaves its kept internals there, and the
  // backward given the same buffer (same layer, weights, geometry and x) rebuilds the rest from them instead
  // of re-running the forward's GEMMs and mixer core.
  void layer_forward(const UnitLayout& lay, const void* w, const Geo& g, const void* x, void* y, void* ws,
                     cudaStream_t st, void* keep = nullptr);
  // dx may alias dy, not x.
  void layer_backward(const UnitLayout& lay, const void* w, const Geo& g, const void* x, const void* dy, void* dx,
                      float* dw, void* ws, cudaStream_t st, void* keep = nullptr);
  void embed_forward(const void* emb, const int32_t* ids, int64_t T, void* x, int* err, cudaStream_t st);
  void embed_backward(const int32_t* ids, int64_t T, const void* dx, float* demb, void* ws, int64_t ws_bytes,
                      cudaStream_t st);
  // Final norm + LM head + CE; acc[0] += loss sum, acc[1] += counted tokens. dx == nullptr: loss only; else d_norm_w
  // (the final norm's weight) ACCUMULATES, and d_lm_w too unless null (Backend::head_loss_lse). lse: nullable.
  void head_loss(const UnitLayout& head_lay, const void* head_w, const void* lm_w, const int32_t* targets, int64_t T,
                 const void* x, float loss_scale, void* dx, float* d_norm_w, float* d_lm_w, float* lse, double* acc,
                 int* err, void* ws, cudaStream_t st);
  // Backend::head_lm_grad_slice in the same workspace as head_loss on T rows.
  void head_lm_grad_slice(const UnitLayout& head_lay, const void* head_w, const void* lm_w, const int32_t* targets,
                          int64_t T, const void* x, const float* lse, float loss_scale, int64_t v0, int64_t nv,
                          float* dw, void* ws, cudaStream_t st);
  void head_logits(const UnitLayout& head_lay, const void* head_w, const void* lm_w, const void* x,
                   const int64_t* rows, int64_t n_rows, float* out, void* ws, cudaStream_t st);

  // Each mixer's one-time preparation for geometry g (Mixer::prepare).
  void prepare(const Geo& g);

 private:
  Mixer& mixer(const UnitLayout& lay) const;
  ModelConfig c_;
  Gemm& gemm_;
  const float* inv_freq_;
  float norm_off_;  // 1 for (1 + w) norms (norm_plus_one), else 0
  bool check_finite_;  // KernelOptions::check_finite: probe each layer's outputs (finite_check.h)
  std::array<std::unique_ptr<Mixer>, kNumLayerKinds> mixers_;  // of the kinds present
  int64_t head_chunk_ = 4096;
  int64_t mlp_bound_ = 0;
};

}  // namespace lt::cuda
