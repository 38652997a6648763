// Optimizer state file: exact moments (fp32, or 8-bit codes + block scales) and the step count.
// CpuAdamW::save/load (state_io.cpp) and the shard merge/split of src/dist use these primitives, so
// there is one definition of the format.
//
// Layout (little endian, version 1):
//   "LTOPTST\0" | u32 version=1 | u32 block=kQ8Block | i64 step | f32 beta1, beta2, eps | u32 n_units
//   per unit:   u32 n_tensors | i64 unit_numel
//   per tensor: i64 offset | i64 numel | u8 format | u32 name_len | name bytes
//   u64 header hash
//   payload, per tensor in order: fp32: m, v (numel*4 each); 8bit: m codes, v codes (numel each),
//   m scales, v scales (blocks*4 each)
//   u64 payload hash
// The hash is a 64-bit multiply-xor over 8-byte words (not cryptographic; it catches corruption).
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "optim/optimizer.h"

namespace lt::optim {

constexpr char kStateMagic[8] = {'L', 'T', 'O', 'P', 'T', 'S', 'T', '\0'};
constexpr uint32_t kStateVersion = 1;

// The file's checksum. A final partial word is tagged with its byte count.
class StateHasher {
 public:
  void add(const void* data, size_t n);
  uint64_t done();  // the hash of everything added; starts over

 private:
  void word(uint64_t w);
  uint64_t h_ = 0x9e3779b97f4a7c15ull, tail_ = 0;
  int tail_n_ = 0;
};

// The header's scalars (the layout is the UnitSpec list).
struct StateHeader {
  int64_t step = 0;
  float beta1 = 0, beta2 = 0, eps = 0;
};

// Writes <file>.tmp; commit() adds the payload checksum and renames it to <file>. Every failure is an
// lt::Error naming the file and the OS reason (strerror: "No space left on device"); a writer destroyed
// without commit() removes <file>.tmp.
class StateWriter {
 public:
  explicit StateWriter(const std::filesystem::path& file);
  ~StateWriter();
  StateWriter(const StateWriter&) = delete;
  StateWriter& operator=(const StateWriter&) = delete;
  void header(const StateHeader& h, const std::vector<UnitSpec>& units);  // header + its checksum
  void raw(const void* p, size_t n);                                      // payload bytes, in file order
  void commit();

 private:
  template <typename T> void pod(const T& v) { raw(&v, sizeof(T)); }
  void put(const void* p, size_t n);  // unhashed bytes (the checksums)
  std::filesystem::path path_, tmp_;
  std::FILE* out_ = nullptr;
  StateHasher hash_;
};

class StateReader {
 public:
  explicit StateReader(const std::filesystem::path& file);
  // Reads and checks magic, version, block size, the layout against `expect` (unit and tensor counts,
  // names, ranges, formats), the header checksum and the file size the layout implies.
  StateHeader header(const std::vector<UnitSpec>& expect);
  // Sequential payload reads (hashed), then check_payload() once everything was read.
  void raw(void* p, size_t n, const char* what);
  void check_payload() { check_hash("payload"); }
  // Or: hash the whole payload in one pass and check it, then read_at() any byte range (unhashed).
  void verify_payload();
  void read_at(uint64_t offset, void* p, size_t n);
  uint64_t pos() const { return pos_; }  // after header(): where the payload starts
  const std::filesystem::path& path() const { return path_; }

 private:
  template <typename T> T pod(const char* what) {
    T v;
    raw(&v, sizeof(T), what);
    return v;
  }
  void check_hash(const char* what);
  std::filesystem::path path_;
  std::ifstream in_;
  uint64_t size_ = 0, pos_ = 0;
  StateHasher hash_;
};

}  // namespace lt::optim
