// The BPE model of an HF tokenizer.json, merging exactly as HF tokenizers does: a priority queue
// ordered by (merge rank, position), one merge at a time. Two input modes:
//  - byte-level (the pre-tokenizer ends with ByteLevel): a word is raw bytes, each byte is the
//    vocabulary entry of its ByteLevel character;
//  - character-level (SentencePiece-style vocabularies): a word is UTF-8, each character is looked
//    up (with continuing_subword_prefix / end_of_word_suffix where set); a missing one becomes its
//    <0xXX> byte tokens (byte_fallback) or unk_token (fuse_unk joins runs), or is dropped.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
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

struct BpeOptions {
  bool byte_level = true;
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix, end_of_word_suffix;
};

class BpeModel {
 public:
  BpeModel(const BpeModel&) = delete;
  // vocab: token (UTF-8) -> id. merges: pairs in rank order.
  BpeModel(std::unordered_map<std::string, int32_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions opt, const std::string& origin);

  // Appends the ids of one pre-token (raw bytes in byte-level mode, UTF-8 otherwise).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }  // "" for unused ids
  size_t n_merges() const { return merges_.size(); }
  uint64_t dropped_bytes() const { return dropped_; }  // input bytes that became no token
  const BpeOptions& options() const { return opt_; }

 private:
  struct MergeInfo {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  // Initial symbols of a word; returns the number of input bytes dropped.
  size_t initial_symbols(std::string_view word, std::vector<Sym>& syms) const;
  size_t encode_word_uncached(std::string_view word, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, MergeInfo> merges_;
  std::array<int32_t, 256> byte_id_{};      // byte-level: id of each byte's char; char-level: <0xXX> ids
  std::array<int32_t, 128> ascii_id_{};     // char-level: id of each ASCII char (no prefix/suffix)
  int32_t unk_id_ = -1;
  BpeOptions opt_;
  mutable std::atomic<uint64_t> dropped_{0};
  // Identifies this model to the per-thread word caches (bpe.cpp): threads encoding at once share no
  // lock; a serial is never reused, so a cache never serves a destroyed model's entries.
  uint64_t serial_;
};

}  // namespace lt::data
