#include "infer/decode_plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/units.h"
#include "infer/decode_split.h"
#include "infer/decode_state.h"

namespace lt {
namespace {
int64_t align256(int64_t b) { return (b + 255) / 256 * 256; }

struct Carver {
  int64_t used = 0;
  int64_t take(int64_t bytes) {
    const int64_t off = used;
    used += align256(std::max<int64_t>(bytes, 1));
    return off;
  }
};
}  // namespace

WeightsMode parse_weights_mode(const std::string& s) {
  if (s == "auto") return WeightsMode::Auto;
  if (s == "resident") return WeightsMode::Resident;
  if (s == "streamed") return WeightsMode::Streamed;
  fail("--weights '{}': expected auto, resident or streamed", s);
}

const char* weights_mode_name(WeightsMode m) {
  switch (m) {
    case WeightsMode::Auto: return "auto";
    case WeightsMode::Resident: return "resident";
    case WeightsMode::Streamed: return "streamed";
  }
  return "?";
}

DecodeCapacity decode_capacity(int64_t max_batch, int64_t max_seq) {
  LT_CHECK(max_batch > 0 && max_seq > 0, "decoder capacity: batch {} and sequence length {} must be positive",
           max_batch, max_seq);
  DecodeCapacity c;
  c.max_batch = max_batch;
  c.max_seq = max_seq;
  c.prefill_rows = std::max(max_seq, std::min(max_batch * max_seq, kDecodePrefillRows));
  return c;
}

DecodeWorkspace decode_workspace(const ModelConfig& c, const DecodeCapacity& cap) {
  const int64_t R = std::max(cap.prefill_rows, cap.max_batch), B = cap.max_batch;
  const int64_t H = c.hidden, F = c.ffn;
  DecodeWorkspace w;
  Carver cv;
  // Per-pass tables first, in the order of the host staging buffer (one H2D copy fills them).
  w.ids = cv.take(R * 4);
  w.pos = cv.take(R * 4);
  w.seg = cv.take(R * 4);
  w.len = cv.take(B * 4);
  w.slot = cv.take(B * 4);
  w.dst_row = cv.take(R * 8);
  w.row0 = cv.take(B * 8);
  w.last_rows = cv.take(B * 8);
  w.table_bytes = cv.used;
  w.out_ids = cv.take(B * 4);
  w.err = cv.take(4);
  w.inv_freq = cv.take(c.head_dim / 2 * 4);
  w.x = cv.take(R * H * 2);
  w.x1 = cv.take(R * H * 2);
  w.h = cv.take(R * H * 2);
  w.gu = cv.take(R * 2 * F * 2);
  w.act = cv.take(R * F * 2);
  for (int64_t l = 0; l < c.layers; ++l) w.mixer_bytes = std::max(w.mixer_bytes, decode_scratch_bytes(c, c.kind(l), R));
  w.mixer = cv.take(w.mixer_bytes);
  w.xr = cv.take(B * H * 2);
  w.hn = cv.take(B * H * 2);
  w.logits = cv.take(B * c.vocab * 4);
  w.partial = cv.take(decode_attention_partial_floats(B, c.heads, c.head_dim, cap.max_seq) * 4);
  w.gemm = cv.take(kDecodeGemmWorkspace);
  w.bytes = cv.used;
  return w;
}

int64_t decode_unit_bytes(const UnitLayout& u) { return align256(u.numel * 2); }

DecodeMemory decode_memory(const ModelConfig& c, const ModelLayout& lay, const DecodeCapacity& cap) {
  DecodeMemory m;
  m.embedding = decode_unit_bytes(lay.embedding());
  m.head = decode_unit_bytes(lay.head());
  for (int64_t l = 0; l < c.layers; ++l) {
    const int64_t b = decode_unit_bytes(lay.layer(l));
    m.layers += b;
    m.layer_max = std::max(m.layer_max, b);
  }
  for (int64_t l = 0; l < c.layers; ++l) m.kv_cache += decode_state_bytes(c, c.kind(l), cap);
  m.workspace = decode_workspace(c, cap).bytes;
  return m;
}

void fail_decode_does_not_fit(int64_t need, int64_t room, const std::string& what, const std::string& room_desc,
                              const std::string& advice) {
  fail("does not fit: device short by {} {} (needs {}, {}); {}", format_bytes(double(need - room)), what,
       format_bytes(double(need)), room_desc, advice);
}

WeightsChoice choose_weights_mode(const DecodeMemory& m, int64_t budget, WeightsMode asked) {
  WeightsChoice w;
  const int64_t res = m.resident(), str = m.streamed();
  auto detail = [&] {
    return fmt::format("bf16 weights: embedding {}, head {}, layers {} (largest {}); KV cache {}; workspace {}",
                       format_bytes(double(m.embedding)), format_bytes(double(m.head)), format_bytes(double(m.layers)),
                       format_bytes(double(m.layer_max)), format_bytes(double(m.kv_cache)),
                       format_bytes(double(m.workspace)));
  };
  const auto room = [&] { return fmt::format("budget {}; {}", format_bytes(double(budget)), detail()); };
  if (asked == WeightsMode::Resident || (asked == WeightsMode::Auto && res <= budget)) {
    if (res > budget)
      fail_decode_does_not_fit(res, budget, "for resident weights", room(),
                               "use --weights streamed, a smaller --batch-size, or raise --gpu-mem");
    w.mode = WeightsMode::Resident;
    w.device_bytes = res;
    return w;
  }
  if (str > budget)
    fail_decode_does_not_fit(str, budget, "even with streamed weights", room(),
                             "use a smaller --batch-size or --max-new-tokens, or raise --gpu-mem");
  w.mode = WeightsMode::Streamed;
  w.device_bytes = str;
  return w;
}

}  // namespace lt
