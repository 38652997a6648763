// safetensors files: header parsing (from memory, fuzzed), an mmap reader that converts
// BF16/F16/F32 to fp32, and a writer (fp32 or bf16 output).
//
// Format: 8-byte little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
// then the data section; offsets are relative to the data section's start (8 + N).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace lt {

struct StTensor {
  std::string name;
  std::string dtype;           // safetensors spelling: "F32", "BF16", "F16", "I64", ...
  size_t elem_size = 0;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets within the data section
  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

struct StHeader {
  std::vector<StTensor> tensors;                 // in data-offset order
  std::map<std::string, std::string> metadata;   // "__metadata__"
  uint64_t data_offset = 0;                      // 8 + N
  uint64_t data_size = 0;                        // bytes after the header
  const StTensor* find(const std::string& name) const;
};

// Largest header accepted (the format's own reference implementation uses 100 MB).
constexpr uint64_t kMaxSafetensorsHeader = 100ull << 20;

// Parses and validates the header of a whole file held in memory (data, size = file size):
// header length within the file, valid JSON, known dtypes, non-negative shapes, offsets in range,
// sizes matching dtype x shape, no overlapping tensors. Throws lt::Error naming `source`.
StHeader parse_safetensors(const uint8_t* data, size_t size, const std::string& source);

// A read-only mmap of one .safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const StHeader& header() const { return header_; }
  const StTensor* find(const std::string& name) const { return header_.find(name); }
  const uint8_t* raw(const StTensor& t) const { return base_ + header_.data_offset + t.begin; }
  // Converts a BF16/F16/F32 tensor to fp32 into out[numel]. Other dtypes: lt::Error.
  void read_f32(const StTensor& t, float* out) const;

 private:
  std::filesystem::path path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  StHeader header_;
};

// Converts n elements of a BF16/F16/F32 buffer (any alignment) to fp32.
void convert_to_f32(const std::string& dtype, const uint8_t* src, int64_t n, float* out, const std::string& what);

struct StWriteTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // numel(shape) fp32 values; or, when null, read() gives them in pieces
  std::function<void(int64_t begin, int64_t n, float* dst)> read;
  // Or raw bytes written unchanged with their own dtype (tensors passed through from another file,
  // e.g. a vision tower lazytrain does not train). Raw tensors must come after all converted ones.
  const uint8_t* raw = nullptr;
  std::string raw_dtype;
  int64_t raw_bytes = 0;
};
// Writes a .safetensors file with every converted tensor stored as `dtype` (F32 or BF16, round to
// nearest even) and raw tensors as they are.
// Written to <path>.tmp and renamed, so a crash never leaves a half file under the final name.
void write_safetensors(const std::filesystem::path& path, const std::vector<StWriteTensor>& tensors, DType dtype,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace lt
