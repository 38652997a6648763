// Internal to ops_attention.cpp (and its tests): the segment spans the causal attention is split into,
// and the whole-square form that masks segments entry by entry.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "backend/cpu/ops.h"

namespace lt::cpu::attn_detail {

// Rows [begin, end) whose keys all lie in [begin, end): one packed segment, or the whole sequence.
struct Span {
  int64_t begin = 0, end = 0;
};

// One span per maximal run of equal ids, in order, when no id appears again after its run ended
// (packed samples: each segment is contiguous); nullopt when some id recurs. seg == nullptr: one span [0, S).
std::optional<std::vector<Span>> segment_spans(const int32_t* seg, int64_t S);

// attention_fwd / attention_bwd over the whole causal square [S, S] with the segment mask applied
// entry by entry: what attention_fwd/bwd run when segment_spans is nullopt (an id recurs), and the
// reference the span-wise path is tested against.
void attention_fwd_masked(const AttnShape& s, const float* q, const float* k, const float* v, const int32_t* seg,
                          float* out, float* lse);
void attention_bwd_masked(const AttnShape& s, const float* q, const float* k, const float* v, const int32_t* seg,
                          const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv);

}  // namespace lt::cpu::attn_detail
