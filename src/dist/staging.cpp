#include "dist/staging.h"

#include <algorithm>

#include "core/error.h"

namespace lt::dist {

std::vector<std::vector<StagePiece>> staging_rounds(const std::vector<int64_t>& b, int64_t piece) {
  LT_CHECK(piece > 0 && b.size() >= 2, "staging_rounds: piece {} elements, {} bounds", piece, b.size());
  const int W = int(b.size()) - 1;
  int64_t longest = 0;
  for (int r = 0; r < W; ++r) longest = std::max(longest, b[size_t(r) + 1] - b[size_t(r)]);
  std::vector<std::vector<StagePiece>> rounds;
  for (int64_t k = 0; k < longest; k += piece) {
    std::vector<StagePiece> round;
    for (int r = 0; r < W; ++r) {
      const int64_t m = std::min(piece, b[size_t(r) + 1] - b[size_t(r)] - k);
      if (m > 0) round.push_back({r, b[size_t(r)] + k, m, int64_t(r) * piece});
    }
    rounds.push_back(std::move(round));
  }
  return rounds;
}

}  // namespace lt::dist
