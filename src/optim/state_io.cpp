#include "optim/state_io.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>

#include "core/error.h"
#include "core/log.h"
#include "optim/nvme_moments.h"
#include "optim/quant8.h"

namespace lt::optim {

void StateHasher::word(uint64_t w) {
  h_ ^= w;
  h_ *= 0xff51afd7ed558ccdull;
  h_ ^= h_ >> 29;
}

void StateHasher::add(const void* data, size_t n) {
  auto* p = static_cast<const uint8_t*>(data);
  while (n && tail_n_) {  // finish a partial word first
    tail_ |= uint64_t(*p++) << (8 * tail_n_);
    --n;
    if (++tail_n_ == 8) {
      word(tail_);
      tail_ = 0;
      tail_n_ = 0;
    }
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    word(w);
  }
  for (; n; --n) tail_ |= uint64_t(*p++) << (8 * tail_n_++);
}

uint64_t StateHasher::done() {
  if (tail_n_) word(tail_ ^ (uint64_t(tail_n_) << 56));
  const uint64_t r = h_;
  *this = StateHasher{};
  return r;
}

namespace {
constexpr size_t kWriteBuffer = size_t(1) << 20;
}  // namespace

StateWriter::StateWriter(const std::filesystem::path& file)
    : path_(file), tmp_(std::filesystem::path(file) += ".tmp"), out_(std::fopen(tmp_.c_str(), "wb")) {
  LT_CHECK(out_, "optimizer state {}: cannot open for writing: {}", tmp_.string(), std::strerror(errno));
  std::setvbuf(out_, nullptr, _IOFBF, kWriteBuffer);
}

StateWriter::~StateWriter() {
  if (!out_) return;  // committed
  std::fclose(out_);
  std::error_code ec;
  std::filesystem::remove(tmp_, ec);
}

void StateWriter::put(const void* p, size_t n) {
  if (n && std::fwrite(p, 1, n, out_) != n)
    fail("optimizer state {}: write failed: {}", tmp_.string(), std::strerror(errno));
}

void StateWriter::raw(const void* p, size_t n) {
  hash_.add(p, n);
  put(p, n);
}

void StateWriter::header(const StateHeader& h, const std::vector<UnitSpec>& units) {
  raw(kStateMagic, 8);
  pod(kStateVersion);
  pod(uint32_t(kQ8Block));
  pod(int64_t(h.step));
  pod(h.beta1);
  pod(h.beta2);
  pod(h.eps);
  pod(uint32_t(units.size()));
  for (const auto& u : units) {
    pod(uint32_t(u.tensors.size()));
    pod(int64_t(u.numel));
    for (const auto& t : u.tensors) {
      pod(int64_t(t.offset));
      pod(int64_t(t.numel));
      pod(uint8_t(t.format));
      pod(uint32_t(t.name.size()));
      raw(t.name.data(), t.name.size());
    }
  }
  const uint64_t x = hash_.done();
  put(&x, 8);
}

void StateWriter::commit() {
  const uint64_t x = hash_.done();
  put(&x, 8);
  // The buffered bytes reach the file at the flush: a full disk shows here at the latest.
  LT_CHECK(std::fflush(out_) == 0, "optimizer state {}: write failed: {}", tmp_.string(), std::strerror(errno));
  const int closed = std::fclose(out_);
  const int close_errno = errno;
  out_ = nullptr;
  std::error_code ec;
  if (closed != 0) {
    std::filesystem::remove(tmp_, ec);
    fail("optimizer state {}: close failed: {}", tmp_.string(), std::strerror(close_errno));
  }
  std::filesystem::rename(tmp_, path_, ec);
  LT_CHECK(!ec, "optimizer state {}: rename from {} failed: {}", path_.string(), tmp_.string(), ec.message());
}

StateReader::StateReader(const std::filesystem::path& file) : path_(file), in_(file, std::ios::binary) {
  LT_CHECK(in_.good(), "optimizer state {}: cannot open for reading: {}", file.string(), std::strerror(errno));
  std::error_code ec;
  size_ = uint64_t(std::filesystem::file_size(file, ec));
  LT_CHECK(!ec, "optimizer state {}: cannot stat: {}", file.string(), ec.message());
}

void StateReader::raw(void* p, size_t n, const char* what) {
  LT_CHECK(pos_ + n <= size_, "optimizer state {}: truncated while reading {} (needs {} bytes at offset {}, file has {})",
           path_.string(), what, n, pos_, size_);
  in_.read(static_cast<char*>(p), std::streamsize(n));
  LT_CHECK(in_.good(), "optimizer state {}: read error at offset {} ({})", path_.string(), pos_, what);
  pos_ += n;
  hash_.add(p, n);
}

void StateReader::check_hash(const char* what) {
  const uint64_t expect = hash_.done();
  uint64_t got = 0;
  LT_CHECK(pos_ + 8 <= size_, "optimizer state {}: truncated: missing the {} checksum", path_.string(), what);
  in_.read(reinterpret_cast<char*>(&got), 8);
  pos_ += 8;
  LT_CHECK(got == expect, "optimizer state {}: {} checksum mismatch (file {:016x}, computed {:016x}): corrupted",
           path_.string(), what, got, expect);
}

StateHeader StateReader::header(const std::vector<UnitSpec>& expect) {
  const std::string f = path_.string();
  char magic[8];
  raw(magic, 8, "magic");
  LT_CHECK(std::memcmp(magic, kStateMagic, 8) == 0, "optimizer state {}: not a lazytrain optimizer state file (bad magic)",
           f);
  const auto version = pod<uint32_t>("version");
  LT_CHECK(version == kStateVersion, "optimizer state {}: version: expected {}, got {}", f, kStateVersion, version);
  const auto block = pod<uint32_t>("block size");
  LT_CHECK(block == kQ8Block, "optimizer state {}: 8-bit block size: expected {}, got {}", f, kQ8Block, block);
  StateHeader h;
  h.step = pod<int64_t>("step");
  LT_CHECK(h.step >= 0, "optimizer state {}: step: expected >= 0, got {}", f, h.step);
  h.beta1 = pod<float>("beta1");
  h.beta2 = pod<float>("beta2");
  h.eps = pod<float>("eps");
  const auto n_units = pod<uint32_t>("unit count");
  LT_CHECK(n_units == expect.size(), "optimizer state {}: unit count: expected {}, got {}", f, expect.size(), n_units);
  uint64_t payload = 0;
  for (size_t u = 0; u < expect.size(); ++u) {
    const UnitSpec& us = expect[u];
    const auto nt = pod<uint32_t>("tensor count");
    LT_CHECK(nt == us.tensors.size(), "optimizer state {}: unit {} tensor count: expected {}, got {}", f, u,
             us.tensors.size(), nt);
    const auto numel = pod<int64_t>("unit numel");
    LT_CHECK(numel == us.numel, "optimizer state {}: unit {} numel: expected {}, got {}", f, u, us.numel, numel);
    for (const auto& ts : us.tensors) {
      const auto off = pod<int64_t>("tensor offset");
      const auto n = pod<int64_t>("tensor numel");
      const auto fmt = pod<uint8_t>("tensor format");
      const auto nl = pod<uint32_t>("name length");
      LT_CHECK(nl < (1u << 16), "optimizer state {}: unit {} tensor name length {} is implausible", f, u, nl);
      std::string name(nl, '\0');
      raw(name.data(), nl, "tensor name");
      LT_CHECK(name == ts.name, "optimizer state {}: unit {} tensor name: expected '{}', got '{}'", f, u, ts.name, name);
      LT_CHECK(off == ts.offset && n == ts.numel,
               "optimizer state {}: tensor '{}' range: expected offset {} numel {}, got offset {} numel {}", f,
               ts.name, ts.offset, ts.numel, off, n);
      LT_CHECK(fmt == uint8_t(ts.format), "optimizer state {}: tensor '{}' state format: expected {}, got {}", f,
               ts.name, state_format_name(ts.format), fmt <= 1 ? state_format_name(StateFormat(fmt)) : "invalid");
      payload += uint64_t(state_bytes(ts.numel, ts.format));
    }
  }
  check_hash("header");
  const uint64_t expect_size = pos_ + payload + 8;
  LT_CHECK(size_ == expect_size, "optimizer state {}: size: expected {} bytes for this layout, file has {}{}", f,
           expect_size, size_, size_ < expect_size ? " (truncated)" : "");
  return h;
}

void StateReader::verify_payload() {
  std::vector<char> buf(1 << 20);
  while (pos_ + 8 < size_) {
    const size_t n = size_t(std::min<uint64_t>(buf.size(), size_ - 8 - pos_));
    raw(buf.data(), n, "payload");
  }
  check_payload();
}

void StateReader::read_at(uint64_t offset, void* p, size_t n) {
  LT_CHECK(offset + n <= size_, "optimizer state {}: read of {} bytes at offset {} past the end ({} bytes)",
           path_.string(), n, offset, size_);
  in_.seekg(std::streamoff(offset));
  in_.read(static_cast<char*>(p), std::streamsize(n));
  LT_CHECK(in_.good(), "optimizer state {}: read error at offset {}", path_.string(), offset);
}

namespace {

// One tensor's payload, in file order (fp32: m, v; 8-bit: m codes, v codes, m scales, v scales).
void write_payload(StateWriter& w, const TensorSpec& ts, const MomentArrays& a) {
  const size_t n = size_t(ts.numel), blocks = size_t((ts.numel + kQ8Block - 1) / kQ8Block);
  if (ts.format == StateFormat::F32) {
    w.raw(a.m, n * 4);
    w.raw(a.v, n * 4);
  } else {
    w.raw(a.mq, n);
    w.raw(a.vq, n);
    w.raw(a.ms, blocks * 4);
    w.raw(a.vs, blocks * 4);
  }
}

void read_payload(StateReader& r, const TensorSpec& ts, const MomentArrays& a) {
  const size_t n = size_t(ts.numel), blocks = size_t((ts.numel + kQ8Block - 1) / kQ8Block);
  if (ts.format == StateFormat::F32) {
    r.raw(a.m, n * 4, "m");
    r.raw(a.v, n * 4, "v");
  } else {
    r.raw(a.mq, n, "m codes");
    r.raw(a.vq, n, "v codes");
    r.raw(a.ms, blocks * 4, "m scales");
    r.raw(a.vs, blocks * 4, "v scales");
  }
}

}  // namespace

// Units with NVMe moments stream through one staging slot: save reads each unit's file into it, load
// fills it from the state file and writes a second generation of the unit's file, switched to only
// after the payload checksum passed (so a failed load changes nothing; the disk holds both meanwhile).
void CpuAdamW::save(const std::filesystem::path& file) {
  wait_all();
  std::lock_guard<std::mutex> lk(mu_);
  LT_CHECK(norm_known_, "optimizer state {}: cannot save in the middle of a step", file.string());
  if (nvme_) {
    nvme_check_intact_locked("save the optimizer state");
    nvme_release_leftovers_locked();
    nvme_->quiesce();
  }
  StateWriter w(file);
  w.header({step_, cfg_.beta1, cfg_.beta2, cfg_.eps}, units_);
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitSpec& spec = units_[u];
    if (spec.moments_on_nvme) nvme_->read_image(int(u), nvme_->scratch());
    for (size_t t = 0; t < spec.tensors.size(); ++t)
      write_payload(w, spec.tensors[t],
                    spec.moments_on_nvme ? image_arrays(nvme_->scratch(), spec, nvme_->image(int(u)), t)
                                         : arrays(int(u), int(t)));
  }
  w.commit();
}

void CpuAdamW::load(const std::filesystem::path& file) {
  wait_all();
  std::lock_guard<std::mutex> lk(mu_);
  LT_CHECK(norm_known_, "optimizer state {}: cannot load in the middle of a step", file.string());
  if (nvme_) {
    nvme_release_leftovers_locked();
    nvme_->quiesce();
  }
  StateReader r(file);
  const StateHeader h = r.header(units_);
  // Read into fresh buffers (NVMe: files of the other generation); commit only when the payload
  // checksum matches.
  std::vector<std::vector<TensorState>> fresh(units_.size());
  try {
    for (size_t u = 0; u < units_.size(); ++u) {
      const UnitSpec& spec = units_[u];
      fresh[u].resize(spec.tensors.size());
      if (spec.moments_on_nvme) {
        // Remainders in the image (UnitSpec::remainders_on_nvme) are not in the state file: kept as they are.
        if (spec.remainders_on_nvme) nvme_->read_image(int(u), nvme_->scratch());
        else std::memset(nvme_->scratch(), 0, size_t(nvme_->image(int(u)).bytes));
        for (size_t t = 0; t < spec.tensors.size(); ++t)
          read_payload(r, spec.tensors[t], image_arrays(nvme_->scratch(), spec, nvme_->image(int(u)), t));
        nvme_->stage_image(int(u), nvme_->scratch());
        continue;
      }
      for (size_t t = 0; t < spec.tensors.size(); ++t) {
        const TensorSpec& ts = spec.tensors[t];
        TensorState& st = fresh[u][t];
        if (ts.format == StateFormat::F32) {
          st.m.reset(size_t(ts.numel));
          st.v.reset(size_t(ts.numel));
        } else {
          size_t blocks = size_t((ts.numel + kQ8Block - 1) / kQ8Block);
          st.mq.reset(size_t(ts.numel));
          st.vq.reset(size_t(ts.numel));
          st.ms.reset(blocks);
          st.vs.reset(blocks);
        }
        read_payload(r, ts, {st.m.data(), st.v.data(), st.mq.data(), st.vq.data(), st.ms.data(), st.vs.data()});
      }
    }
    r.check_payload();
  } catch (...) {
    if (nvme_) nvme_->discard_staged();
    throw;
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    state_[u].tensors = std::move(fresh[u]);
    state_[u].nv.lost = false;
    state_[u].nv.read_error = nullptr;
  }
  if (nvme_) nvme_->commit_staged();
  step_ = h.step;
  info_ = StepInfo{step_, 0, 1.0f, false};
  begun_ = false;  // the next step starts with begin_step()
  if (h.beta1 != cfg_.beta1 || h.beta2 != cfg_.beta2 || h.eps != cfg_.eps)
    log_warn("optimizer state {}: saved with beta1={} beta2={} eps={}, continuing with beta1={} beta2={} eps={}",
             file.string(), h.beta1, h.beta2, h.eps, cfg_.beta1, cfg_.beta2, cfg_.eps);
}

}  // namespace lt::optim
