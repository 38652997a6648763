// Label shifting of sequence.h.
#include "model/sequence.h"

namespace lt {

void shift_labels(const int32_t* labels, const SeqGeometry& g, int32_t* targets) {
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t s = 0; s < g.seq; ++s) {
      const int64_t t = b * g.seq + s;
      const bool last = s + 1 == g.seq || (g.segments && g.segments[t + 1] != g.segments[t]);
      targets[t] = last ? kIgnoreIndex : labels[t + 1];
    }
  }
}

}  // namespace lt
