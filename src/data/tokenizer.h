// Tokenizer loaded from an HF tokenizer.json: added/special tokens split out first, then the
// normalizer, pre-tokenizer and BPE model of the file (components.h, bpe.h), the decoder for decode,
// and the post-processor (TemplateProcessing, e.g. a BOS) for add_special_tokens. Reproduces HF
// `tokenizers` exactly on the real files of the families in tests/fixtures/families (docs/data.md).
#pragma once
#include <cstdint>
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/bpe.h"
#include "data/components.h"

namespace lt::data {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false, normalized = false;
};

class Tokenizer {
 public:
  static Tokenizer from_file(const std::string& path);
  // `origin` names the source in error messages (a file path).
  static Tokenizer from_json(const nlohmann::json& j, const std::string& origin);

  // add_special_tokens: apply the post-processor (HF's default is true; Qwen2 adds nothing, Llama-3
  // prepends <|begin_of_text|>). parse_special: recognise added tokens written inside the text (HF
  // always does; turn off to treat user text as plain text).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false,
                              bool parse_special = true) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;
  // The same without the final U+FFFD substitution: the model's bytes exactly (NUL and invalid UTF-8
  // included), for byte-exact output of generated text.
  std::string decode_bytes(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // Where each token of `ids` (the encoding of `text`) starts in `text`: starts[k] for token k, plus
  // text.size() at the end. Known when the tokens' bytes spell the text exactly (byte-level BPE whose
  // normalizer left the text unchanged, added tokens without stripped spaces); false otherwise.
  bool token_starts(std::string_view text, const std::vector<int32_t>& ids, std::vector<size_t>& starts) const;

  // The pipeline's stages, for tests: the normalizer on a text, and the pre-tokens of a normalized
  // text (raw bytes for byte-level models, as the BPE sees them).
  std::string normalize(std::string_view text) const;
  std::vector<std::string> pre_tokenize(std::string_view normalized, bool at_start = true) const;
  const BpeModel& model() const { return *bpe_; }

  std::optional<int32_t> token_to_id(const std::string& token) const;  // added tokens first, then vocab
  // Token string (ByteLevel form for BPE tokens); empty when the id is unknown.
  std::string id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  int32_t vocab_size() const { return vocab_size_; }  // max id + 1
  const std::vector<AddedToken>& added_tokens() const { return added_; }

 private:
  Tokenizer() = default;
  static Tokenizer from_json_checked(const nlohmann::json& j, const std::string& origin);
  // Parts of from_json_checked, in order after the model, normalizer, pre-tokenizer and decoder.
  void parse_added_tokens(const nlohmann::json& at, const std::string& origin);
  void parse_post_processor(const nlohmann::json& p, const std::string& where);
  void build_lookup_tables();
  // Appends the ids of plain text (no added tokens inside), running normalizer and pre-tokenizer.
  void encode_plain(std::string_view text, std::vector<int32_t>& out, bool parse_normalized_added, bool at_start) const;
  void encode_pretokenized(std::string_view normalized, std::vector<int32_t>& out, bool at_start) const;
  std::string decode_impl(const std::vector<int32_t>& ids, bool skip_special_tokens, bool raw) const;
  // Splits text on added tokens of the given kind (normalized or not), leftmost-longest.
  struct Piece {
    size_t begin, end;
    int32_t added_id;  // -1: plain text
  };
  std::vector<Piece> split_added(std::string_view text, bool normalized_kind) const;

  std::shared_ptr<BpeModel> bpe_;
  std::shared_ptr<const Normalizer> normalizer_;
  std::shared_ptr<const PreTokenizer> pre_;
  std::shared_ptr<const Decoder> decoder_;
  bool byte_level_ = false;          // pre-tokenizer ends with ByteLevel: byte-level BPE input
  bool decoder_bytelevel_ = false;   // decoder is exactly ByteLevel: per-id byte table
  std::vector<AddedToken> added_;
  bool has_normalized_added_ = false;
  std::unordered_map<std::string, int32_t> added_by_content_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  std::vector<int32_t> post_prefix_, post_suffix_;  // TemplateProcessing "single"
  // Added tokens by first byte, for [normalized kind]: indices into added_.
  std::array<std::vector<uint32_t>, 256> added_first_[2];
  // Per id: the token string, or its ByteLevel-decoded bytes when decoder_bytelevel_; "" if unknown.
  // Shared: copies of a Tokenizer (e.g. inside ChatTemplate) stay cheap for 150k-token vocabularies.
  std::shared_ptr<const std::vector<std::string>> id_bytes_;
  std::shared_ptr<const std::vector<uint8_t>> id_known_;
  int32_t vocab_size_ = 0;
};

}  // namespace lt::data
