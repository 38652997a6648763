#include "data/bpe.h"

#include <array>
#include <atomic>
#include <functional>
#include <queue>

#include "core/error.h"
#include "data/unicode.h"

namespace lt::data {

namespace {
std::atomic<uint64_t> g_next_serial{1};  // BpeModel::serial_
}  // namespace

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
                   const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions opt,
                   const std::string& origin)
    : vocab_(std::move(vocab)), opt_(std::move(opt)), serial_(g_next_serial++) {
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
  auto find = [&](const std::string& s) {
    auto it = vocab_.find(s);
    return it == vocab_.end() ? -1 : it->second;
  };
  if (opt_.byte_level) {
    const auto& b2u = byte_to_unicode();
    for (int b = 0; b < 256; ++b) {
      std::string s;
      utf8_append(s, b2u[b]);
      byte_id_[b] = find(s);
    }
  } else {
    for (int b = 0; b < 256; ++b) byte_id_[b] = find(fmt::format("<0x{:02X}>", b));
    for (int c = 0; c < 128; ++c) ascii_id_[c] = find(std::string(1, static_cast<char>(c)));
  }
  if (opt_.unk_token) {
    unk_id_ = find(*opt_.unk_token);
    LT_CHECK(unk_id_ >= 0, "{}: model.unk_token '{}' is not in model.vocab", origin, *opt_.unk_token);
  }
  const std::string& pre = opt_.continuing_subword_prefix;
  merges_.reserve(merges.size() * 2);
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    const std::string ab = (!pre.empty() && b.compare(0, pre.size(), pre) == 0) ? a + b.substr(pre.size()) : a + b;
    auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(ab);
    LT_CHECK(ia != vocab_.end(), "{}: model.merges[{}]: token '{}' is not in model.vocab", origin, r, a);
    LT_CHECK(ib != vocab_.end(), "{}: model.merges[{}]: token '{}' is not in model.vocab", origin, r, b);
    LT_CHECK(iab != vocab_.end(), "{}: model.merges[{}]: merged token '{}' is not in model.vocab", origin, r, ab);
    // A duplicated pair keeps its first (lowest) rank, as HF does when building its merge map.
    merges_.try_emplace(key(ia->second, ib->second), MergeInfo{static_cast<int32_t>(r), iab->second});
  }
}

namespace {
struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
// Word -> ids of short words, one per (thread, model): no locks on the hot path. A thread keeps the
// caches of its last few models; a full cache is cleared.
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>, SvHash, std::equal_to<>> map;
};
constexpr size_t kMaxCachedWord = 48, kCacheEntries = 1 << 16;
WordCache& word_cache(uint64_t serial) {
  thread_local std::array<WordCache, 4> caches;
  WordCache& c = caches[serial % caches.size()];
  if (c.owner != serial) {
    c.map.clear();
    c.owner = serial;
  }
  return c;
}
}  // namespace

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() > kMaxCachedWord) {
    (void)encode_word_uncached(word, out);
    return;
  }
  WordCache& c = word_cache(serial_);
  if (auto it = c.map.find(word); it != c.map.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t start = out.size();
  if (encode_word_uncached(word, out) > 0) return;  // keep the drop count exact: do not cache such words
  if (c.map.size() >= kCacheEntries) c.map.clear();
  c.map.emplace(std::string(word), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
}

size_t BpeModel::initial_symbols(std::string_view word, std::vector<Sym>& syms) const {
  auto push = [&](int32_t id) {
    const auto n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, n + 1, true});
  };
  size_t dropped = 0;
  if (opt_.byte_level) {
    for (unsigned char b : word) {
      if (byte_id_[b] < 0) ++dropped;
      else push(byte_id_[b]);
    }
    return dropped;
  }
  const bool affix = !opt_.continuing_subword_prefix.empty() || !opt_.end_of_word_suffix.empty();
  bool prev_unk = false;
  std::string key_buf;
  for (size_t i = 0; i < word.size();) {
    char32_t cp;
    const size_t n = static_cast<size_t>(utf8_next(word, i, cp));
    int32_t id = -1;
    if (!affix && cp < 128) {
      id = ascii_id_[cp];
    } else {
      key_buf.clear();
      if (i > 0) key_buf += opt_.continuing_subword_prefix;
      key_buf.append(word.substr(i, n));
      if (i + n == word.size()) key_buf += opt_.end_of_word_suffix;
      auto it = vocab_.find(key_buf);
      if (it != vocab_.end()) id = it->second;
    }
    if (id >= 0) {
      push(id);
      prev_unk = false;
    } else {
      bool done = false;
      if (opt_.byte_fallback) {
        bool all = true;
        for (size_t k = 0; k < n; ++k) all = all && byte_id_[static_cast<unsigned char>(word[i + k])] >= 0;
        if (all) {
          for (size_t k = 0; k < n; ++k) push(byte_id_[static_cast<unsigned char>(word[i + k])]);
          done = true;
          prev_unk = false;
        }
      }
      if (!done) {
        if (unk_id_ >= 0) {
          if (!(opt_.fuse_unk && prev_unk)) push(unk_id_);
          prev_unk = true;
        } else {
          dropped += n;
        }
      }
    }
    i += n;
  }
  return dropped;
}

size_t BpeModel::encode_word_uncached(std::string_view word, std::vector<int32_t>& out) const {
  if (opt_.ignore_merges) {
    auto it = vocab_.find(opt_.byte_level ? bytes_to_bytelevel(word) : std::string(word));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return 0;
    }
  }
  thread_local std::vector<Sym> syms;
  syms.clear();
  const size_t dropped = initial_symbols(word, syms);
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
