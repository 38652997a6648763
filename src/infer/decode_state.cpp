#include "infer/decode_state.h"

#include <algorithm>

#include "infer/decode_plan.h"
#include "model/mixer.h"

namespace lt {
namespace {
struct Bump {
  int64_t used = 0;
  int64_t take(int64_t bytes) {
    const int64_t off = used;
    used += (std::max<int64_t>(bytes, 1) + 255) / 256 * 256;
    return off;
  }
};
}  // namespace

AttnDecodeState attn_decode_state(const ModelConfig& c, const DecodeCapacity& cap) {
  const int64_t rows = cap.max_batch * cap.max_seq;
  AttnDecodeState s;
  Bump b;
  s.k = b.take(rows * c.kv_dim() * 2);
  s.v = b.take(rows * c.kv_dim() * 2);
  s.bytes = b.used;
  return s;
}

AttnDecodeScratch attn_decode_scratch(const ModelConfig& c, int64_t R) {
  const int64_t QD = c.q_dim(), KD = c.kv_dim();
  AttnDecodeScratch s;
  Bump b;
  s.q = b.take(R * QD * 2);
  s.k = b.take(R * KD * 2);
  s.v = b.take(R * KD * 2);
  s.o = b.take(R * QD * 2);
  s.lse = b.take(R * c.heads * 4);
  if (c.attn_output_gate) {
    s.qfull = b.take(R * 2 * QD * 2);
    s.gate = b.take(R * QD * 2);
  }
  s.bytes = b.used;
  return s;
}

GdnDecodeState gdn_decode_state(const ModelConfig& c, const DecodeCapacity& cap) {
  const LinearAttnConfig& l = c.linear;
  GdnDecodeState s;
  Bump b;
  s.conv = b.take(cap.max_batch * l.conv_dim() * (l.conv_kernel - 1) * 4);
  s.rec = b.take(cap.max_batch * l.v_heads * l.k_head_dim * l.v_head_dim * 4);
  s.bytes = b.used;
  return s;
}

GdnDecodeScratch gdn_decode_scratch(const ModelConfig& c, int64_t R) {
  const LinearAttnConfig& l = c.linear;
  const int64_t C = l.conv_dim(), KD = l.key_dim(), VD = l.value_dim(), NV = l.v_heads;
  const int64_t chunks = (R + kDeltaRuleChunk - 1) / kDeltaRuleChunk;
  GdnDecodeScratch s;
  Bump b;
  s.qkv = b.take(R * C * 2);
  s.z = b.take(R * VD * 2);
  s.b = b.take(R * NV * 2);
  s.a = b.take(R * NV * 2);
  s.y = b.take(R * C * 2);
  s.qn = b.take(R * KD * 2);
  s.kn = b.take(R * KD * 2);
  s.v = b.take(R * VD * 2);
  s.o = b.take(R * VD * 2);
  s.gout = b.take(R * VD * 2);
  s.g = b.take(R * NV * 4);
  s.beta = b.take(R * NV * 4);
  s.rstd = b.take(R * NV * 4);
  s.chunk_states = b.take(chunks * NV * l.k_head_dim * l.v_head_dim * 4);
  s.bytes = b.used;
  return s;
}

int64_t decode_state_bytes(const ModelConfig& c, LayerKind k, const DecodeCapacity& cap) {
  switch (k) {
    case LayerKind::Attention: return attn_decode_state(c, cap).bytes;
    case LayerKind::GatedDeltaNet: return gdn_decode_state(c, cap).bytes;
  }
  return 0;
}

int64_t decode_scratch_bytes(const ModelConfig& c, LayerKind k, int64_t rows) {
  switch (k) {
    case LayerKind::Attention: return attn_decode_scratch(c, rows).bytes;
    case LayerKind::GatedDeltaNet: return gdn_decode_scratch(c, rows).bytes;
  }
  return 0;
}

}  // namespace lt
