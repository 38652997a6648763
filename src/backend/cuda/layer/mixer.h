// The token mixer of a decoder layer on the GPU, one implementation per layer kind (model/layer_kind.h):
// mixer_attention.cpp (causal GQA attention, with Qwen3.5's output gate and partial RoPE) and
// mixer_deltanet.cpp (Gated DeltaNet). layer.cpp owns what every kind shares (the two RMSNorms, the
// residuals, the SwiGLU MLP) and calls the mixer of c.kind(lay.layer) through this interface, as the
// CPU reference does (backend/cpu/mixer_ref.h).
//
// Workspace: a mixer carves its buffers in two parts, each after the shared part's: `keep`, what its
// forward writes and its backward reads, and `scratch`, the rest. A plain layer call carves both from
// the one layer workspace (the same Carve), and backward() follows forward() on it (layer_backward
// re-runs the internals from x). With kept internals (LayerEngine::layer_forward_keep) `keep` is the
// caller's buffer for that layer: the forward fills it, other layers run, and bind() re-carves the same
// buffers (no compute) before backward(); `scratch` is then the shared workspace, clobbered in between.
// The layer workspace is the shared part plus the largest mixer workspace of the kinds present.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/kernel_options.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt::cuda {

struct Geo {  // device pointers, as lt::DevGeometry
  int64_t batch = 0, seq = 0;
  const int32_t* positions = nullptr;
  const int32_t* segments = nullptr;
  int64_t runs = 0, longest_run = 0;  // as lt::DevGeometry
  int64_t tokens() const { return batch * seq; }
};

// Bump allocator over a workspace (256-byte aligned pieces). With base == nullptr it only counts bytes
// (used by the *_workspace_bytes functions so that the sizes always match the carving).
struct Carve {
  char* base;
  int64_t used = 0;
  explicit Carve(void* b) : base(static_cast<char*>(b)) {}
  template <typename T>
  T* take(int64_t n) {
    const int64_t bytes = (n * int64_t(sizeof(T)) + 255) / 256 * 256;
    T* p = base ? reinterpret_cast<T*>(base + used) : nullptr;
    used += bytes;
    return p;
  }
};

// Y = X W^T GEMMs over the T rows of a layer call (bf16 activations, bf16 weights in HF [out, in]
// layout, fp32 weight gradients accumulated).
struct Linear {
  Gemm& gemm;
  int64_t T;
  cudaStream_t st;
  // Y[T,N] = X W^T (+bias) (+ beta Y, or beta res when res is given); ldc: row stride of Y (0: N).
  void fwd(const void* X, const void* W, const void* bias, void* Y, int64_t N, int64_t K, int64_t ldc, float beta,
           const void* res = nullptr) const;
  // dX[T,K] (+)= dY[T,N] W[N,K]; ldy: row stride of dY (0: N).
  void dx(const void* dY, int64_t ldy, const void* W, void* dX, int64_t N, int64_t K, float beta) const;
  // dW[N,K] += dY^T X (fp32).
  void dw(const void* dY, int64_t ldy, const void* X, float* dW, int64_t N, int64_t K) const;
};

// Scratch the shared part lends the mixer: fp32 norm statistics and column-sum partials.
struct NormScratch {
  float* rstd;     // [T * kNormRowsPerToken]
  float* partial;  // [norm_partial_floats(max dim)]
};
// Rows per token the shared rstd buffer holds (the mixers' per-head norms need up to this many).
int64_t norm_rows_per_token(const ModelConfig& c);

// Everything one mixer call needs besides its inputs and outputs.
struct MixerCall {
  const UnitLayout& lay;
  const void* w;  // the layer's flat bf16 weights
  const Geo& g;
  Carve& keep;     // positioned after the shared part's kept buffers
  Carve& scratch;  // after the shared part's scratch buffers (the same Carve as keep in a plain call)
  NormScratch ns;
  cudaStream_t st;
};

class Mixer {
 public:
  virtual ~Mixer() = default;
  // Bytes the mixer carves for batch x seq rows (forward and backward together), and the part of them kept.
  virtual int64_t workspace_bytes(int64_t batch, int64_t seq) const = 0;
  virtual int64_t keep_bytes(int64_t batch, int64_t seq) const = 0;
  // Carves this call's buffers as forward() does, computing nothing: before backward() on kept internals.
  virtual void bind(const MixerCall& m) = 0;
  // x1 [T, hidden] = res + mixer(h), h the layer's normalised input (the residual add is fused into the
  // output projection).
  virtual void forward(const MixerCall& m, const void* h, const void* res, void* x1) = 0;
  // Right after forward() on the same workspace: dh [T, hidden] WRITTEN from dout = d x1; the mixer's
  // weight gradients ACCUMULATED into dw (the layer's flat fp32 gradient). dout stays unchanged.
  virtual void backward(const MixerCall& m, const void* h, const void* dout, void* dh, float* dw) = 0;
  // Before the first call at geometry g (host side, outside any step): whatever a first call would build once
  // (attention: cuDNN's graphs for g's shape). Default: nothing.
  virtual void prepare(const Geo& g) { (void)g; }
};

// k: the backend's kernel options (the attention path, the finiteness probes).
std::unique_ptr<Mixer> make_attention_mixer(const ModelConfig& c, Gemm& gemm, const float* inv_freq,
                                            const KernelOptions& k);
// Throws lt::Error naming what is unsupported when the Gated DeltaNet shape cannot run on the GPU.
std::unique_ptr<Mixer> make_deltanet_mixer(const ModelConfig& c, Gemm& gemm);

// Typed weight / gradient pointers of a layer's flat buffers (optional: null when the layer has none).
inline const uint16_t* wptr(const void* w, const UnitLayout& lay, const char* s) {
  return static_cast<const uint16_t*>(w) + lay.find(s).offset;
}
inline const uint16_t* wopt(const void* w, const UnitLayout& lay, const char* s) {
  const ParamInfo* p = lay.try_find(s);
  return p ? static_cast<const uint16_t*>(w) + p->offset : nullptr;
}
inline float* gptr(float* dw, const UnitLayout& lay, const char* s) { return dw + lay.find(s).offset; }
inline float* gopt(float* dw, const UnitLayout& lay, const char* s) {
  const ParamInfo* p = lay.try_find(s);
  return p ? dw + p->offset : nullptr;
}

}  // namespace lt::cuda
