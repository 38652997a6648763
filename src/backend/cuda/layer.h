// Decoder layer, embedding and head on the GPU, composed from the kernels and cuBLASLt GEMMs.
// Semantics follow src/backend/cpu/reference.h: activations bf16 [T, hidden], weights one flat bf16
// buffer in UnitLayout order, weight gradients fp32 in the same layout, ACCUMULATED (+=).
// layer_backward recomputes the layer's internals from x. Everything is enqueued on one stream.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "backend/cuda/gemm.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt::cuda {

struct Geo {  // device pointers, as lt::DevGeometry
  int64_t batch = 0, seq = 0;
  const int32_t* positions = nullptr;
  const int32_t* segments = nullptr;
  int64_t tokens() const { return batch * seq; }
};

class LayerEngine {
 public:
  // Needs a device fp32 array for inv_freq (hd/2 floats) and the GEMM object; workspace is handed in
  // per call (at least workspace_bytes(T) bytes, 256-byte aligned).
  LayerEngine(const ModelConfig& c, Gemm& gemm, const float* inv_freq_dev);

  int64_t layer_workspace_bytes(int64_t T) const;
  int64_t head_workspace_bytes(int64_t T) const;
  int64_t embed_workspace_bytes(int64_t T) const;
  int64_t head_chunk_rows() const { return head_chunk_; }
  void set_head_chunk_rows(int64_t r) { head_chunk_ = r; }

  void layer_forward(const UnitLayout& lay, const void* w, const Geo& g, const void* x, void* y, void* ws,
                     cudaStream_t st);
  // dx may alias dy, not x.
  void layer_backward(const UnitLayout& lay, const void* w, const Geo& g, const void* x, const void* dy, void* dx,
                      float* dw, void* ws, cudaStream_t st);
  void embed_forward(const void* emb, const int32_t* ids, int64_t T, void* x, int* err, cudaStream_t st);
  void embed_backward(const int32_t* ids, int64_t T, const void* dx, float* demb, void* ws, int64_t ws_bytes,
                      cudaStream_t st);
  // Final norm + LM head + CE; acc[0] += loss sum, acc[1] += counted tokens. dx == nullptr: loss only.
  void head_loss(const UnitLayout& head_lay, const void* head_w, const void* lm_w, const int32_t* targets, int64_t T,
                 const void* x, float loss_scale, void* dx, float* d_head_w, float* d_lm_w, double* acc, int* err,
                 void* ws, cudaStream_t st);
  void head_logits(const UnitLayout& head_lay, const void* head_w, const void* lm_w, const void* x,
                   const int64_t* rows, int64_t n_rows, float* out, void* ws, cudaStream_t st);

 private:
  struct Carve;
  ModelConfig c_;
  Gemm& gemm_;
  const float* inv_freq_;
  int64_t head_chunk_ = 4096;
};

}  // namespace lt::cuda
