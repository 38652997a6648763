// Optimizer state file: exact moments (fp32, or 8-bit codes + block scales) and the step count.
//
// Layout (little endian):
//   "LTOPTST\0" | u32 version=1 | u32 block=kQ8Block | i64 step | f32 beta1, beta2, eps | u32 n_units
//   per unit:   u32 n_tensors | i64 unit_numel
//   per tensor: i64 offset | i64 numel | u8 format | u32 name_len | name bytes
//   u64 header hash
//   payload, per tensor in order: fp32: m, v (numel*4 each); 8bit: m codes, v codes (numel each),
//   m scales, v scales (blocks*4 each)
//   u64 payload hash
// The hash is a 64-bit multiply-xor over 8-byte words (not cryptographic; it catches corruption).
#include <cstring>
#include <fstream>
#include <string>
#include <system_error>

#include "core/error.h"
#include "core/log.h"
#include "optim/optimizer.h"

namespace lt::optim {
namespace {

constexpr char kMagic[8] = {'L', 'T', 'O', 'P', 'T', 'S', 'T', '\0'};
constexpr uint32_t kVersion = 1;

struct Hasher {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  uint64_t tail = 0;
  int tail_n = 0;
  void word(uint64_t w) {
    h ^= w;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 29;
  }
  void add(const void* data, size_t n) {
    auto* p = static_cast<const uint8_t*>(data);
    while (n && tail_n) {  // finish a partial word first
      tail |= uint64_t(*p++) << (8 * tail_n);
      --n;
      if (++tail_n == 8) {
        word(tail);
        tail = 0;
        tail_n = 0;
      }
    }
    for (; n >= 8; n -= 8, p += 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      word(w);
    }
    for (; n; --n) tail |= uint64_t(*p++) << (8 * tail_n++);
  }
  uint64_t done() {
    if (tail_n) word(tail ^ (uint64_t(tail_n) << 56));
    tail = 0;
    tail_n = 0;
    return h;
  }
};

class Writer {
 public:
  explicit Writer(const std::filesystem::path& f) : path_(f), out_(f, std::ios::binary | std::ios::trunc) {
    LT_CHECK(out_.good(), "optimizer state {}: cannot open for writing", f.string());
  }
  void raw(const void* p, size_t n) {
    hash_.add(p, n);
    // Large payloads go out in pieces so a stream error is reported promptly.
    out_.write(static_cast<const char*>(p), std::streamsize(n));
    LT_CHECK(out_.good(), "optimizer state {}: write failed", path_.string());
  }
  template <typename T> void pod(const T& v) { raw(&v, sizeof(T)); }
  void hash_mark() {
    uint64_t h = hash_.done();
    out_.write(reinterpret_cast<const char*>(&h), 8);
    hash_ = Hasher{};
  }
  void close() {
    out_.close();
    LT_CHECK(!out_.fail(), "optimizer state {}: close failed", path_.string());
  }

 private:
  std::filesystem::path path_;
  std::ofstream out_;
  Hasher hash_;
};

class Reader {
 public:
  explicit Reader(const std::filesystem::path& f) : path_(f), in_(f, std::ios::binary) {
    LT_CHECK(in_.good(), "optimizer state {}: cannot open for reading", f.string());
    std::error_code ec;
    size_ = uint64_t(std::filesystem::file_size(f, ec));
    LT_CHECK(!ec, "optimizer state {}: cannot stat: {}", f.string(), ec.message());
  }
  void raw(void* p, size_t n, const char* what) {
    LT_CHECK(pos_ + n <= size_, "optimizer state {}: truncated while reading {} (needs {} bytes at offset {}, file has {})",
             path_.string(), what, n, pos_, size_);
    in_.read(static_cast<char*>(p), std::streamsize(n));
    LT_CHECK(in_.good(), "optimizer state {}: read error at offset {} ({})", path_.string(), pos_, what);
    pos_ += n;
    hash_.add(p, n);
  }
  template <typename T> T pod(const char* what) {
    T v;
    raw(&v, sizeof(T), what);
    return v;
  }
  void check_hash(const char* what) {
    uint64_t expect = hash_.done();
    uint64_t got = 0;
    LT_CHECK(pos_ + 8 <= size_, "optimizer state {}: truncated: missing the {} checksum", path_.string(), what);
    in_.read(reinterpret_cast<char*>(&got), 8);
    pos_ += 8;
    LT_CHECK(got == expect, "optimizer state {}: {} checksum mismatch (file {:016x}, computed {:016x}): corrupted",
             path_.string(), what, got, expect);
    hash_ = Hasher{};
  }
  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::ifstream in_;
  uint64_t size_ = 0, pos_ = 0;
  Hasher hash_;
};

}  // namespace

void CpuAdamW::save(const std::filesystem::path& file) {
  wait_all();
  std::lock_guard<std::mutex> lk(mu_);
  LT_CHECK(norm_known_, "optimizer state {}: cannot save in the middle of a step", file.string());
  std::filesystem::path tmp = file;
  tmp += ".tmp";
  {
    Writer w(tmp);
    w.raw(kMagic, 8);
    w.pod(kVersion);
    w.pod(uint32_t(kQ8Block));
    w.pod(int64_t(step_));
    w.pod(cfg_.beta1);
    w.pod(cfg_.beta2);
    w.pod(cfg_.eps);
    w.pod(uint32_t(units_.size()));
    for (auto& u : units_) {
      w.pod(uint32_t(u.tensors.size()));
      w.pod(int64_t(u.numel));
      for (auto& t : u.tensors) {
        w.pod(int64_t(t.offset));
        w.pod(int64_t(t.numel));
        w.pod(uint8_t(t.format));
        w.pod(uint32_t(t.name.size()));
        w.raw(t.name.data(), t.name.size());
      }
    }
    w.hash_mark();
    for (size_t u = 0; u < units_.size(); ++u)
      for (size_t t = 0; t < units_[u].tensors.size(); ++t) {
        const TensorState& st = state_[u].tensors[t];
        if (units_[u].tensors[t].format == StateFormat::F32) {
          w.raw(st.m.data(), st.m.bytes());
          w.raw(st.v.data(), st.v.bytes());
        } else {
          w.raw(st.mq.data(), st.mq.bytes());
          w.raw(st.vq.data(), st.vq.bytes());
          w.raw(st.ms.data(), st.ms.bytes());
          w.raw(st.vs.data(), st.vs.bytes());
        }
      }
    w.hash_mark();
    w.close();
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  LT_CHECK(!ec, "optimizer state {}: rename from {} failed: {}", file.string(), tmp.string(), ec.message());
}

void CpuAdamW::load(const std::filesystem::path& file) {
  wait_all();
  std::lock_guard<std::mutex> lk(mu_);
  LT_CHECK(norm_known_, "optimizer state {}: cannot load in the middle of a step", file.string());
  Reader r(file);
  const std::string f = file.string();
  char magic[8];
  r.raw(magic, 8, "magic");
  LT_CHECK(std::memcmp(magic, kMagic, 8) == 0, "optimizer state {}: not a lazytrain optimizer state file (bad magic)", f);
  uint32_t version = r.pod<uint32_t>("version");
  LT_CHECK(version == kVersion, "optimizer state {}: version: expected {}, got {}", f, kVersion, version);
  uint32_t block = r.pod<uint32_t>("block size");
  LT_CHECK(block == kQ8Block, "optimizer state {}: 8-bit block size: expected {}, got {}", f, kQ8Block, block);
  int64_t step = r.pod<int64_t>("step");
  LT_CHECK(step >= 0, "optimizer state {}: step: expected >= 0, got {}", f, step);
  float b1 = r.pod<float>("beta1"), b2 = r.pod<float>("beta2"), eps = r.pod<float>("eps");
  uint32_t n_units = r.pod<uint32_t>("unit count");
  LT_CHECK(n_units == units_.size(), "optimizer state {}: unit count: expected {}, got {}", f, units_.size(), n_units);
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitSpec& us = units_[u];
    uint32_t nt = r.pod<uint32_t>("tensor count");
    LT_CHECK(nt == us.tensors.size(), "optimizer state {}: unit {} tensor count: expected {}, got {}", f, u,
             us.tensors.size(), nt);
    int64_t numel = r.pod<int64_t>("unit numel");
    LT_CHECK(numel == us.numel, "optimizer state {}: unit {} numel: expected {}, got {}", f, u, us.numel, numel);
    for (auto& ts : us.tensors) {
      int64_t off = r.pod<int64_t>("tensor offset");
      int64_t n = r.pod<int64_t>("tensor numel");
      uint8_t fmt = r.pod<uint8_t>("tensor format");
      uint32_t nl = r.pod<uint32_t>("name length");
      LT_CHECK(nl < (1u << 16), "optimizer state {}: unit {} tensor name length {} is implausible", f, u, nl);
      std::string name(nl, '\0');
      r.raw(name.data(), nl, "tensor name");
      LT_CHECK(name == ts.name, "optimizer state {}: unit {} tensor name: expected '{}', got '{}'", f, u, ts.name, name);
      LT_CHECK(off == ts.offset && n == ts.numel,
               "optimizer state {}: tensor '{}' range: expected offset {} numel {}, got offset {} numel {}", f,
               ts.name, ts.offset, ts.numel, off, n);
      LT_CHECK(fmt == uint8_t(ts.format),
               "optimizer state {}: tensor '{}' state format: expected {}, got {}", f, ts.name,
               state_format_name(ts.format), fmt <= 1 ? state_format_name(StateFormat(fmt)) : "invalid");
    }
  }
  r.check_hash("header");
  uint64_t payload = 0;
  for (auto& u : units_)
    for (auto& t : u.tensors) payload += uint64_t(optim::state_bytes(t.numel, t.format));
  uint64_t expect_size = r.pos() + payload + 8;
  LT_CHECK(r.size() == expect_size, "optimizer state {}: size: expected {} bytes for this layout, file has {}{}", f,
           expect_size, r.size(), r.size() < expect_size ? " (truncated)" : "");
  // Read into fresh buffers; commit only when the payload checksum matches.
  std::vector<std::vector<TensorState>> fresh(units_.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    fresh[u].resize(units_[u].tensors.size());
    for (size_t t = 0; t < units_[u].tensors.size(); ++t) {
      const TensorSpec& ts = units_[u].tensors[t];
      TensorState& st = fresh[u][t];
      if (ts.format == StateFormat::F32) {
        st.m.reset(size_t(ts.numel));
        st.v.reset(size_t(ts.numel));
        r.raw(st.m.data(), st.m.bytes(), "m");
        r.raw(st.v.data(), st.v.bytes(), "v");
      } else {
        size_t blocks = size_t((ts.numel + kQ8Block - 1) / kQ8Block);
        st.mq.reset(size_t(ts.numel));
        st.vq.reset(size_t(ts.numel));
        st.ms.reset(blocks);
        st.vs.reset(blocks);
        r.raw(st.mq.data(), st.mq.bytes(), "m codes");
        r.raw(st.vq.data(), st.vq.bytes(), "v codes");
        r.raw(st.ms.data(), st.ms.bytes(), "m scales");
        r.raw(st.vs.data(), st.vs.bytes(), "v scales");
      }
    }
  }
  r.check_hash("payload");
  for (size_t u = 0; u < units_.size(); ++u) state_[u].tensors = std::move(fresh[u]);
  step_ = step;
  info_ = StepInfo{step_, 0, 1.0f, false};
  begun_ = false;  // the next step starts with begin_step()
  if (b1 != cfg_.beta1 || b2 != cfg_.beta2 || eps != cfg_.eps)
    log_warn("optimizer state {}: saved with beta1={} beta2={} eps={}, continuing with beta1={} beta2={} eps={}", f,
             b1, b2, eps, cfg_.beta1, cfg_.beta2, cfg_.eps);
}

}  // namespace lt::optim
