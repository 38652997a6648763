// Sequence conventions shared by every backend, the executor, the data pipeline and the trainer:
//  * Activations are row-major [T, hidden], T = batch * seq, sample-major (sample b's tokens are rows b*seq..).
//  * targets are already shifted: targets[t] is the token predicted at row t, or kIgnoreIndex (no loss).
//    shift_labels() turns HF-style labels into targets (last row of each sample becomes kIgnoreIndex;
//    with packing, the last row of each segment too).
#pragma once
#include <cstdint>

namespace lt {

// Label / target value that carries no loss (HF's ignore_index).
constexpr int32_t kIgnoreIndex = -100;

// Shape of a batch of sequences and, optionally, its packing.
struct SeqGeometry {
  int64_t batch = 0;
  int64_t seq = 0;
  const int32_t* positions = nullptr;  // [batch*seq] RoPE positions; nullptr means 0..seq-1 per sample
  const int32_t* segments = nullptr;   // [batch*seq] packed-sequence segment ids; nullptr means one segment per sample
  int64_t tokens() const { return batch * seq; }
};

// Calls f(begin, end) for each maximal run of equal ids in seg[0, seq), in order: one packed segment each (a
// row's padding tail is a run too). seg == nullptr: the one run [0, seq).
template <class F>
void for_each_segment_run(const int32_t* seg, int64_t seq, F&& f) {
  int64_t begin = 0;
  for (int64_t i = 1; i <= seq; ++i) {
    if (i < seq && (!seg || seg[i] == seg[begin])) continue;
    f(begin, i);
    begin = i;
  }
}

// Labels [B*S] in HF convention (labels[t] is token t itself, kIgnoreIndex ignored) to shifted targets.
void shift_labels(const int32_t* labels, const SeqGeometry& g, int32_t* targets);

}  // namespace lt
