#include "infer/cuda/decode_mixer.h"

namespace lt::cuda {

std::unique_ptr<DecodeMixer> make_decode_mixer(const ModelConfig& c, LayerKind k) {
  switch (k) {
    case LayerKind::Attention: return make_attention_decode_mixer(c);
    case LayerKind::GatedDeltaNet: return make_deltanet_decode_mixer(c);
  }
  return nullptr;
}

void decode_linear(Gemm& gemm, cudaStream_t st, int64_t T, const void* X, const uint16_t* W, const uint16_t* bias,
                   void* Y, int64_t N, int64_t K, int64_t ldc, const void* res) {
  GemmArgs a;
  a.trans_b = true;
  a.m = T, a.n = N, a.k = K;
  a.a = X, a.b = W, a.c = Y, a.ldc = ldc, a.bias = bias;
  if (res) a.beta = 1.f, a.c_in = res;
  gemm.run(a, st);
}

}  // namespace lt::cuda
