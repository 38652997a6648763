// The tokenizer.json pipeline components: normalizers, pre-tokenizers and decoders, each parsed from
// its JSON object with every field checked (an unsupported type or value is an lt::Error naming the
// JSON path and the supported choices). Semantics follow HF `tokenizers` (checked against it on the
// real files of the families in tests/fixtures/families).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace lt::data {

// ---- normalizers: NFC NFD NFKC NFKD Replace Prepend Lowercase Strip StripAccents Sequence
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s) const = 0;
};
// null -> nullptr.
std::unique_ptr<Normalizer> parse_normalizer(const nlohmann::json& j, const std::string& where);

// ---- pre-tokenizers: Split ByteLevel Digits Metaspace Whitespace WhitespaceSplit Punctuation Sequence
// Pieces of text: spans into buf (UTF-8, or raw bytes after ByteLevel).
struct Pieces {
  std::string buf;
  std::vector<std::pair<uint32_t, uint32_t>> spans;
  void reset(std::string_view s) {
    buf.assign(s);
    spans.clear();
    if (!s.empty()) spans.emplace_back(0u, static_cast<uint32_t>(s.size()));
  }
  std::string_view piece(size_t i) const { return std::string_view(buf).substr(spans[i].first, spans[i].second - spans[i].first); }
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // at_start: the text begins at offset 0 of the original input (Metaspace prepend_scheme "first").
  virtual void apply(Pieces& p, bool at_start) const = 0;
};
struct PreTokenizerInfo {
  std::unique_ptr<PreTokenizer> pre;  // nullptr for null
  bool byte_level = false;            // ends with ByteLevel: pieces are raw bytes for a byte-level BPE
};
PreTokenizerInfo parse_pre_tokenizer(const nlohmann::json& j, const std::string& where);

// ---- decoders: ByteLevel Metaspace ByteFallback Fuse Strip Replace Sequence
class Decoder {
 public:
  virtual ~Decoder() = default;
  // Tokens in, tokens out (HF's decode_chain). raw: byte-fallback/byte-level bytes are kept as they
  // are (no U+FFFD for invalid UTF-8), for byte-exact output.
  virtual void decode_chain(std::vector<std::string>& toks, bool raw) const = 0;
};
struct DecoderInfo {
  std::unique_ptr<Decoder> dec;  // nullptr for null: tokens joined with " "
  bool pure_byte_level = false;  // exactly ByteLevel: per-token tables can be used
};
DecoderInfo parse_decoder(const nlohmann::json& j, const std::string& where);

}  // namespace lt::data
