#include "data/bpe.h"

#include <queue>

#include "core/error.h"
#include "data/unicode.h"

namespace lt::data {

const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    auto printable = [](int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); };
    int n = 0;
    for (int b = 0; b < 256; ++b) t[b] = printable(b) ? char32_t(b) : char32_t(256 + n++);
    return t;
  }();
  return table;
}

int unicode_to_byte(char32_t cp) {
  static const std::unordered_map<char32_t, int> inv = [] {
    std::unordered_map<char32_t, int> m;
    const auto& t = byte_to_unicode();
    for (int b = 0; b < 256; ++b) m[t[b]] = b;
    return m;
  }();
  auto it = inv.find(cp);
  return it == inv.end() ? -1 : it->second;
}

std::string bytes_to_bytelevel(std::string_view bytes) {
  const auto& t = byte_to_unicode();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) utf8_append(out, t[b]);
  return out;
}

BpeModel::BpeModel(std::unordered_map<std::string, int32_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
                   const std::string& origin)
    : vocab_(std::move(vocab)), ignore_merges_(ignore_merges) {
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab_) {
    LT_CHECK(id >= 0 && id < kMaxVocab, "{}: model.vocab['{}']: id must be in 0..{}, got {}", origin, tok, kMaxVocab - 1, id);
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [tok, id] : vocab_) {
    LT_CHECK(id_to_token_[id].empty(), "{}: model.vocab: id {} is used by both '{}' and '{}'", origin, id,
             id_to_token_[id], tok);
    id_to_token_[id] = tok;
  }
  const auto& b2u = byte_to_unicode();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, b2u[b]);
    auto it = vocab_.find(s);
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
  merges_.reserve(merges.size() * 2);
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    LT_CHECK(ia != vocab_.end(), "{}: model.merges[{}]: token '{}' is not in model.vocab", origin, r, a);
    LT_CHECK(ib != vocab_.end(), "{}: model.merges[{}]: token '{}' is not in model.vocab", origin, r, b);
    LT_CHECK(iab != vocab_.end(), "{}: model.merges[{}]: merged token '{}' is not in model.vocab", origin, r, a + b);
    // A duplicated pair keeps its first (lowest) rank, as HF does when building its merge map.
    merges_.try_emplace(key(ia->second, ib->second), MergeInfo{static_cast<int32_t>(r), iab->second});
  }
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  constexpr size_t kMaxCachedWord = 48, kCacheEntries = 1 << 16;
  if (bytes.size() > kMaxCachedWord) {
    (void)encode_word_uncached(bytes, out);
    return;
  }
  const std::string key(bytes);
  {
    std::lock_guard<std::mutex> lk(cache_mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  if (encode_word_uncached(bytes, out) > 0) return;  // keep the drop count exact: do not cache such words
  std::lock_guard<std::mutex> lk(cache_mu_);
  if (cache_.size() >= kCacheEntries) cache_.clear();
  cache_.emplace(key, std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
}

size_t BpeModel::encode_word_uncached(std::string_view bytes, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto it = vocab_.find(bytes_to_bytelevel(bytes));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return 0;
    }
  }
  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Sym> syms;
  syms.reserve(bytes.size());
  size_t dropped = 0;
  for (unsigned char b : bytes) {
    const int32_t id = byte_id_[b];
    if (id < 0) {
      ++dropped;
      continue;
    }
    const auto n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, n + 1, true});
  }
  dropped_ += dropped;
  if (syms.empty()) return dropped;
  syms.back().next = -1;
  if (syms.size() > 1) {
    struct Cand {
      int32_t rank, pos, new_id;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q;
    auto push_pair = [&](int32_t pos) {
      const int32_t nx = syms[pos].next;
      if (nx < 0) return;
      auto it = merges_.find(key(syms[pos].id, syms[nx].id));
      if (it != merges_.end()) q.push({it->second.rank, pos, it->second.new_id});
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push_pair(i);
    while (!q.empty()) {
      const Cand top = q.top();
      q.pop();
      Sym& s = syms[top.pos];
      if (!s.alive || s.next < 0) continue;
      Sym& r = syms[s.next];
      // Skip entries made stale by earlier merges.
      auto it = merges_.find(key(s.id, r.id));
      if (it == merges_.end() || it->second.new_id != top.new_id) continue;
      s.id = top.new_id;
      r.alive = false;
      s.next = r.next;
      if (s.next >= 0) syms[s.next].prev = top.pos;
      if (s.prev >= 0) push_pair(s.prev);
      push_pair(top.pos);
    }
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
  return dropped;
}

}  // namespace lt::data
