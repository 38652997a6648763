// Byte-level BPE model (the "model" section of an HF tokenizer.json with type BPE), merging exactly
// as HF tokenizers does: a priority queue ordered by (merge rank, position), one merge at a time.
#pragma once
#include <array>
#include <atomic>
#include <mutex>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lt::data {

// GPT-2's reversible byte <-> printable-unicode map used by the ByteLevel pre-tokenizer/decoder.
const std::array<char32_t, 256>& byte_to_unicode();
// Inverse: code point -> byte, or -1 when the code point is not one of the 256 images.
int unicode_to_byte(char32_t cp);
// The ByteLevel form (UTF-8) of raw bytes.
std::string bytes_to_bytelevel(std::string_view bytes);

// Largest supported vocabulary (ids must be below it); real ones are <= 256k.
constexpr int32_t kMaxVocab = 1 << 24;

class BpeModel {
 public:
  // vocab: token (ByteLevel form, UTF-8) -> id. merges: pairs in rank order.
  BpeModel(const BpeModel&) = delete;
  BpeModel(std::unordered_map<std::string, int32_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
           const std::string& origin);

  // Appends the ids of one pre-token given as raw bytes. Bytes whose ByteLevel char is not in the
  // vocabulary are dropped (HF's behaviour without unk_token/byte_fallback); counted in dropped_bytes().
  void encode_word(std::string_view bytes, std::vector<int32_t>& out) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }  // "" for unused ids
  size_t n_merges() const { return merges_.size(); }
  uint64_t dropped_bytes() const { return dropped_; }

 private:
  struct MergeInfo {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, MergeInfo> merges_;
  std::array<int32_t, 256> byte_id_{};
  bool ignore_merges_ = false;
  mutable std::atomic<uint64_t> dropped_{0};
  // Word -> ids cache for short words (most words of real text repeat); cleared when full.
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
  size_t encode_word_uncached(std::string_view bytes, std::vector<int32_t>& out) const;  // returns bytes dropped
};

}  // namespace lt::data
