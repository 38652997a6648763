// libFuzzer target: the tokenizer.json loader and the encode/decode pipeline it builds (normalizers,
// PCRE2 pre-tokenizers, BPE, decoders). The input's first line is text to encode, the rest the JSON.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  const std::string text = nl == std::string::npos ? std::string() : in.substr(0, nl);
  const std::string js = nl == std::string::npos ? in : in.substr(nl + 1);
  nlohmann::json j = nlohmann::json::parse(js, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    const auto tok = lt::data::Tokenizer::from_json(j, "fuzz");
    const auto ids = tok.encode(text, true);
    (void)tok.decode(ids);
    (void)tok.decode_bytes(ids, true);
  } catch (const lt::Error&) {
  }
  return 0;
}
