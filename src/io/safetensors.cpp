#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lt {

using nlohmann::json;

namespace {

// Element sizes of the dtypes the format defines. Only F32/F16/BF16 convert to fp32.
size_t st_elem_size(const std::string& d) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
      {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

std::string clip(const std::string& s) { return s.size() > 80 ? s.substr(0, 77) + "..." : s; }

uint64_t read_u64(const json& v, const std::string& src, const std::string& name, const char* field) {
  LT_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
           "{}: tensor '{}': {} must hold non-negative integers, got {}", src, clip(name), field, clip(v.dump()));
  return v.get<uint64_t>();
}

// Removes a partly written file; a failure to remove it does not hide the error being reported.
void remove_quietly(const std::filesystem::path& p) {
  std::error_code ec;
  std::filesystem::remove(p, ec);
}

}  // namespace

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

const StTensor* StHeader::find(const std::string& name) const {
  for (auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

StHeader parse_safetensors(const uint8_t* data, size_t size, const std::string& src) {
  LT_CHECK(size >= 8, "{}: file is {} bytes, too short for a safetensors header (needs at least 8)", src, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  LT_CHECK(n <= size - 8, "{}: header length {} runs past the end of the file ({} bytes after the length field)", src,
           n, size - 8);
  LT_CHECK(n <= kMaxSafetensorsHeader, "{}: header length {} exceeds the {}-byte limit", src, n,
           kMaxSafetensorsHeader);
  LT_CHECK(n >= 2, "{}: header length {} is too small for a JSON object", src, n);

  StHeader h;
  h.data_offset = 8 + n;
  h.data_size = size - h.data_offset;

  // Depth limit: a valid header nests at most 3 levels; refuse deeper input before building it.
  auto depth_guard = [&](int depth, json::parse_event_t, json&) {
    if (depth > 4) fail("{}: header JSON nests deeper than a safetensors header can", src);
    return true;
  };
  json j;
  try {
    j = json::parse(data + 8, data + 8 + n, depth_guard);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", src, e.what());
  }
  LT_CHECK(j.is_object(), "{}: header must be a JSON object, got {}", src, j.type_name());

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      LT_CHECK(v.is_object(), "{}: __metadata__ must be an object of strings, got {}", src, v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m) {
        LT_CHECK(m.value().is_string(), "{}: __metadata__ '{}' must be a string, got {}", src, clip(m.key()),
                 m.value().type_name());
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    LT_CHECK(v.is_object(), "{}: tensor '{}': entry must be an object, got {}", src, clip(name), v.type_name());
    StTensor t;
    t.name = name;
    auto dt = v.find("dtype");
    LT_CHECK(dt != v.end() && dt->is_string(), "{}: tensor '{}': missing or non-string 'dtype'", src, clip(name));
    t.dtype = dt->get<std::string>();
    t.elem_size = st_elem_size(t.dtype);
    LT_CHECK(t.elem_size > 0,
             "{}: tensor '{}': unknown dtype '{}' (known: F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL F8_E4M3 "
             "F8_E5M2)",
             src, clip(name), clip(t.dtype));
    auto sh = v.find("shape");
    LT_CHECK(sh != v.end() && sh->is_array(), "{}: tensor '{}': missing or non-array 'shape'", src, clip(name));
    // numel * elem_size must not overflow: track it in unsigned 128-bit-free form with a cap.
    unsigned __int128 bytes = t.elem_size;
    for (auto& d : *sh) {
      uint64_t x = read_u64(d, src, name, "shape");
      LT_CHECK(x <= (1ull << 62), "{}: tensor '{}': dimension {} is too large", src, clip(name), x);
      t.shape.push_back(int64_t(x));
      bytes *= x;
      if (bytes > (unsigned __int128)(1ull << 62)) bytes = (unsigned __int128)(1ull << 62) + 1;
    }
    auto off = v.find("data_offsets");
    LT_CHECK(off != v.end() && off->is_array() && off->size() == 2,
             "{}: tensor '{}': 'data_offsets' must be an array [begin, end]", src, clip(name));
    t.begin = read_u64((*off)[0], src, name, "data_offsets");
    t.end = read_u64((*off)[1], src, name, "data_offsets");
    LT_CHECK(t.begin <= t.end, "{}: tensor '{}': data_offsets begin {} > end {}", src, clip(name), t.begin, t.end);
    LT_CHECK(t.end <= h.data_size,
             "{}: tensor '{}': data_offsets [{}, {}] run past the data section ({} bytes): file truncated?", src,
             clip(name), t.begin, t.end, h.data_size);
    LT_CHECK(bytes == (unsigned __int128)(t.end - t.begin),
             "{}: tensor '{}': {} x {} needs {} bytes but data_offsets [{}, {}] span {}", src, clip(name), t.dtype,
             clip(sh->dump()), uint64_t(std::min<unsigned __int128>(bytes, ~0ull)), t.begin, t.end, t.end - t.begin);
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const StTensor& a, const StTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < h.tensors.size(); ++i) {
    const auto& a = h.tensors[i - 1];
    const auto& b = h.tensors[i];
    // Empty tensors occupy no bytes and cannot overlap anything.
    if (a.end > b.begin && a.nbytes() > 0 && b.nbytes() > 0)
      fail("{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", src, clip(a.name), a.begin, a.end, clip(b.name),
           b.begin, b.end);
  }
  return h;
}

void convert_to_f32(const std::string& dtype, const uint8_t* src, int64_t n, float* out, const std::string& what) {
  LT_CHECK(dtype == "F32" || dtype == "BF16" || dtype == "F16",
           "{}: dtype {} cannot be loaded as floating-point weights (supported: F32, BF16, F16)", what, dtype);
  // An empty tensor converts to nothing. Its pointers may be null (an empty vector's data()), and
  // memcpy with a null pointer is undefined even for zero bytes (found by fuzz_safetensors).
  if (n <= 0) return;
  if (dtype == "F32") {
    std::memcpy(out, src, size_t(n) * 4);
    return;
  }
  // One loop per type: the per-element choice is not hoisted at -O2.
  auto convert16 = [&](auto to_f32) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      out[i] = to_f32(h);
    }
  };
  if (dtype == "BF16") convert16(bf16_to_f32);
  else convert16(f16_to_f32);
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LT_CHECK(fd >= 0, "{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path.string());
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    LT_CHECK(p != MAP_FAILED, "{}: mmap failed: {}", path.string(), std::strerror(errno));
    base_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  try {
    static const uint8_t empty[1] = {0};
    header_ = parse_safetensors(base_ ? base_ : empty, size_, path.string());
  } catch (...) {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
    base_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

void SafetensorsFile::read_f32(const StTensor& t, float* out) const {
  convert_to_f32(t.dtype, raw(t), t.numel(), out, path_.string() + ": tensor '" + t.name + "'");
}

void write_safetensors(const std::filesystem::path& path, const std::vector<StWriteTensor>& tensors, DType dtype,
                       const std::map<std::string, std::string>& metadata) {
  LT_CHECK(dtype == DType::F32 || dtype == DType::BF16, "{}: can only write F32 or BF16 tensors, not {}",
           path.string(), dtype_name(dtype));
  const size_t es = dtype_size(dtype);
  json h = json::object();
  uint64_t off = 0;
  bool seen_raw = false;
  for (auto& t : tensors) {
    LT_CHECK(!h.contains(t.name) && t.name != "__metadata__", "{}: duplicate tensor name '{}'", path.string(),
             t.name);
    LT_CHECK(t.raw || !seen_raw, "{}: tensor '{}': converted tensors must precede raw ones", path.string(), t.name);
    seen_raw = seen_raw || t.raw;
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    const uint64_t bytes = t.raw ? uint64_t(t.raw_bytes) : uint64_t(n) * es;
    h[t.name] = {{"dtype", t.raw ? t.raw_dtype : std::string(dtype_name(dtype))},
                 {"shape", t.shape},
                 {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string hs = h.dump();
  hs.append((8 - hs.size() % 8) % 8, ' ');  // data section 8-byte aligned, as the reference writer does

  auto tmp = path;
  tmp += ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  LT_CHECK(f, "{}: cannot create: {}", tmp.string(), std::strerror(errno));
  auto put = [&](const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f) != n) {
      int e = errno;
      std::fclose(f);
      remove_quietly(tmp);
      fail("{}: write failed: {}", tmp.string(), std::strerror(e));
    }
  };
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(hs.size()) >> (8 * i));
  put(len, 8);
  put(hs.data(), hs.size());
  // BF16: convert the next chunk (on a helper thread) while this one is written.
  constexpr int64_t chunk = 4 << 20;
  std::vector<bf16_t> bufs[2];
  std::future<void> pending;
  struct Piece {
    const StWriteTensor* t;
    int64_t begin, n;
  };
  // The fp32 values of a piece: in place, or read into scratch.
  auto values = [](const Piece& pc, std::vector<float>& scratch) -> const float* {
    if (pc.t->data) return pc.t->data + pc.begin;
    scratch.resize(size_t(pc.n));
    pc.t->read(pc.begin, pc.n, scratch.data());
    return scratch.data();
  };
  std::vector<Piece> pieces;
  std::vector<float> f32_scratch;
  for (auto& t : tensors) {
    if (t.raw) continue;
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    LT_CHECK(n == 0 || t.data || t.read, "{}: tensor '{}' has no values", path.string(), t.name);
    for (int64_t i = 0; i < n; i += chunk) {
      const Piece pc{&t, i, std::min(chunk, n - i)};
      if (dtype == DType::F32)
        put(values(pc, f32_scratch), size_t(pc.n) * 4);
      else
        pieces.push_back(pc);
    }
  }
  auto convert = [values](Piece pc, std::vector<bf16_t>* out) {
    std::vector<float> scratch;
    const float* src = values(pc, scratch);
    out->resize(size_t(pc.n));
    for (int64_t k = 0; k < pc.n; ++k) (*out)[size_t(k)] = f32_to_bf16(src[k]);
  };
  if (!pieces.empty()) pending = std::async(std::launch::async, convert, pieces[0], &bufs[0]);
  for (size_t i = 0; i < pieces.size(); ++i) {
    pending.get();
    if (i + 1 < pieces.size()) pending = std::async(std::launch::async, convert, pieces[i + 1], &bufs[(i + 1) % 2]);
    put(bufs[i % 2].data(), size_t(pieces[i].n) * 2);  // on failure `put` throws; ~future joins the helper
  }
  for (auto& t : tensors)
    if (t.raw) put(t.raw, size_t(t.raw_bytes));
  // Durable before it gets the final name (checkpoints must survive a crash right after saving).
  if (std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0) {
    int e = errno;
    std::fclose(f);
    remove_quietly(tmp);
    fail("{}: flush failed: {}", tmp.string(), std::strerror(e));
  }
  if (std::fclose(f) != 0) {
    const int e = errno;
    remove_quietly(tmp);
    fail("{}: close failed: {}", tmp.string(), std::strerror(e));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  LT_CHECK(!ec, "{}: rename from {} failed: {}", path.string(), tmp.string(), ec.message());
}

}  // namespace lt
