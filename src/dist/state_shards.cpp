#include "dist/state_shards.h"

#include <cstring>
#include <fstream>
#include <string>

#include "core/error.h"

namespace lt::dist {
namespace fs = std::filesystem;
using optim::StateFormat;
using optim::UnitSpec;

namespace {

constexpr char kMagic[8] = {'L', 'T', 'O', 'P', 'T', 'S', 'T', '\0'};
constexpr uint32_t kVersion = 1;

// The state file's checksum (same definition as src/optim/state_io.cpp).
struct Hasher {
  uint64_t h = 0x9e3779b97f4a7c15ull, tail = 0;
  int tail_n = 0;
  void word(uint64_t w) {
    h ^= w;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 29;
  }
  void add(const void* data, size_t n) {
    auto* p = static_cast<const uint8_t*>(data);
    while (n && tail_n) {
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
    uint64_t r = h;
    *this = Hasher{};
    return r;
  }
};

int64_t blocks(int64_t n) { return (n + optim::kQ8Block - 1) / optim::kQ8Block; }

// A tensor's payload parts in file order.
std::vector<int> part_kinds(StateFormat f) {  // 4 = fp32 per element, 1 = code per element, 0 = scale per block
  return f == StateFormat::F32 ? std::vector<int>{4, 4} : std::vector<int>{1, 1, 0, 0};
}
int64_t part_bytes(int kind, int64_t numel) { return kind == 0 ? blocks(numel) * 4 : numel * kind; }
// Byte range of the part for elements [a, a+n) of a tensor (a on a block boundary for 8-bit parts).
std::pair<int64_t, int64_t> part_slice(int kind, int64_t a, int64_t n) {
  if (kind == 0) return {a / optim::kQ8Block * 4, blocks(n) * 4};
  return {a * kind, n * kind};
}

struct StateFile {
  fs::path path;
  std::ifstream in;
  int64_t step = 0;
  float b1 = 0, b2 = 0, eps = 0;
  std::vector<UnitSpec> units;
  std::vector<std::vector<int64_t>> pos;  // [unit][tensor] payload start offset in the file
};

template <typename T>
T rd(std::ifstream& in, Hasher& h, const fs::path& p, const char* what) {
  T v;
  in.read(reinterpret_cast<char*>(&v), sizeof(T));
  LT_CHECK(in.good(), "optimizer state {}: truncated while reading {}", p.string(), what);
  h.add(&v, sizeof(T));
  return v;
}

void check_hash(std::ifstream& in, Hasher& h, const fs::path& p, const char* what) {
  uint64_t expect = h.done(), got = 0;
  in.read(reinterpret_cast<char*>(&got), 8);
  LT_CHECK(in.good(), "optimizer state {}: truncated: missing the {} checksum", p.string(), what);
  LT_CHECK(got == expect, "optimizer state {}: {} checksum mismatch (file {:016x}, computed {:016x}): corrupted",
           p.string(), what, got, expect);
}

// Opens a state file, checks it against `expect` (layout) and both checksums; records payload offsets.
void open_state(StateFile& f, const fs::path& path, const std::vector<UnitSpec>& expect) {
  f.path = path;
  f.in.open(path, std::ios::binary);
  LT_CHECK(f.in.good(), "optimizer state {}: cannot open for reading", path.string());
  const std::string ps = path.string();
  Hasher h;
  char magic[8];
  f.in.read(magic, 8);
  LT_CHECK(f.in.good() && std::memcmp(magic, kMagic, 8) == 0, "optimizer state {}: not a lazytrain optimizer state file",
           ps);
  h.add(magic, 8);
  auto version = rd<uint32_t>(f.in, h, path, "version");
  LT_CHECK(version == kVersion, "optimizer state {}: version: expected {}, got {}", ps, kVersion, version);
  auto block = rd<uint32_t>(f.in, h, path, "block size");
  LT_CHECK(block == optim::kQ8Block, "optimizer state {}: block size: expected {}, got {}", ps, optim::kQ8Block, block);
  f.step = rd<int64_t>(f.in, h, path, "step");
  f.b1 = rd<float>(f.in, h, path, "beta1");
  f.b2 = rd<float>(f.in, h, path, "beta2");
  f.eps = rd<float>(f.in, h, path, "eps");
  auto nu = rd<uint32_t>(f.in, h, path, "unit count");
  LT_CHECK(nu == expect.size(), "optimizer state {}: unit count: expected {}, got {}", ps, expect.size(), nu);
  f.units.resize(nu);
  for (uint32_t u = 0; u < nu; ++u) {
    const UnitSpec& eu = expect[u];
    auto nt = rd<uint32_t>(f.in, h, path, "tensor count");
    LT_CHECK(nt == eu.tensors.size(), "optimizer state {}: unit {} tensor count: expected {}, got {}", ps, u,
             eu.tensors.size(), nt);
    f.units[u].numel = rd<int64_t>(f.in, h, path, "unit numel");
    LT_CHECK(f.units[u].numel == eu.numel, "optimizer state {}: unit {} numel: expected {}, got {}", ps, u, eu.numel,
             f.units[u].numel);
    for (const auto& et : eu.tensors) {
      optim::TensorSpec t;
      t.offset = rd<int64_t>(f.in, h, path, "tensor offset");
      t.numel = rd<int64_t>(f.in, h, path, "tensor numel");
      t.format = StateFormat(rd<uint8_t>(f.in, h, path, "tensor format"));
      auto nl = rd<uint32_t>(f.in, h, path, "name length");
      LT_CHECK(nl < (1u << 16), "optimizer state {}: unit {} tensor name length {} is implausible", ps, u, nl);
      t.name.resize(nl);
      f.in.read(t.name.data(), nl);
      LT_CHECK(f.in.good(), "optimizer state {}: truncated while reading a tensor name", ps);
      h.add(t.name.data(), nl);
      LT_CHECK(t.name == et.name && t.offset == et.offset && t.numel == et.numel && t.format == et.format,
               "optimizer state {}: unit {} tensor: expected '{}' offset {} numel {} {}, got '{}' offset {} numel {} "
               "format {} (saved with another shard layout or optimizer?)",
               ps, u, et.name, et.offset, et.numel, optim::state_format_name(et.format), t.name, t.offset, t.numel,
               int(t.format));
      f.units[u].tensors.push_back(std::move(t));
    }
  }
  check_hash(f.in, h, path, "header");
  int64_t pos = int64_t(f.in.tellg());
  f.pos.resize(nu);
  for (uint32_t u = 0; u < nu; ++u)
    for (const auto& t : f.units[u].tensors) {
      f.pos[u].push_back(pos);
      for (int k : part_kinds(t.format)) pos += part_bytes(k, t.numel);
    }
  std::error_code ec;
  const auto size = int64_t(fs::file_size(path, ec));
  LT_CHECK(!ec && size == pos + 8, "optimizer state {}: size: expected {} bytes for this layout, file has {}", ps, pos + 8,
           size);
  // Verify the payload checksum with one sequential pass.
  std::vector<char> buf(1 << 20);
  for (int64_t at = int64_t(f.in.tellg()), left = 0; at < pos; at += left) {
    left = std::min<int64_t>(int64_t(buf.size()), pos - at);
    f.in.read(buf.data(), left);
    LT_CHECK(f.in.good(), "optimizer state {}: read error in the payload", ps);
    h.add(buf.data(), size_t(left));
  }
  check_hash(f.in, h, path, "payload");
}

void copy_bytes(StateFile& f, int64_t at, int64_t n, std::ofstream& out, Hasher& h, std::vector<char>& buf) {
  f.in.seekg(at);
  while (n > 0) {
    const int64_t k = std::min<int64_t>(n, int64_t(buf.size()));
    f.in.read(buf.data(), k);
    LT_CHECK(f.in.good(), "optimizer state {}: read error at offset {}", f.path.string(), at);
    out.write(buf.data(), k);
    h.add(buf.data(), size_t(k));
    n -= k;
    at += k;
  }
}

struct Out {
  fs::path path, tmp;
  std::ofstream out;
  Hasher h;
  explicit Out(const fs::path& p) : path(p), tmp(fs::path(p) += ".tmp"), out(tmp, std::ios::binary | std::ios::trunc) {
    LT_CHECK(out.good(), "optimizer state {}: cannot open for writing", tmp.string());
  }
  template <typename T> void pod(const T& v) {
    out.write(reinterpret_cast<const char*>(&v), sizeof(T));
    h.add(&v, sizeof(T));
  }
  void mark() {
    uint64_t x = h.done();
    out.write(reinterpret_cast<const char*>(&x), 8);
  }
  void header(const StateFile& src, const std::vector<UnitSpec>& units) {
    out.write(kMagic, 8);
    h.add(kMagic, 8);
    pod(kVersion);
    pod(uint32_t(optim::kQ8Block));
    pod(src.step);
    pod(src.b1);
    pod(src.b2);
    pod(src.eps);
    pod(uint32_t(units.size()));
    for (const auto& u : units) {
      pod(uint32_t(u.tensors.size()));
      pod(int64_t(u.numel));
      for (const auto& t : u.tensors) {
        pod(int64_t(t.offset));
        pod(int64_t(t.numel));
        pod(uint8_t(t.format));
        pod(uint32_t(t.name.size()));
        out.write(t.name.data(), std::streamsize(t.name.size()));
        h.add(t.name.data(), t.name.size());
      }
    }
    mark();
  }
  void commit() {
    mark();
    out.close();
    LT_CHECK(!out.fail(), "optimizer state {}: write failed", tmp.string());
    std::error_code ec;
    fs::rename(tmp, path, ec);
    LT_CHECK(!ec, "optimizer state {}: rename from {} failed: {}", path.string(), tmp.string(), ec.message());
  }
};

int find_tensor(const UnitSpec& u, const std::string& name) {
  for (size_t i = 0; i < u.tensors.size(); ++i)
    if (u.tensors[i].name == name) return int(i);
  return -1;
}

}  // namespace

void merge_state_shards(const std::vector<fs::path>& files, const std::vector<UnitSpec>& full, const ShardLayout& s,
                        const fs::path& out_path) {
  LT_CHECK(int(files.size()) == s.world, "merge_state_shards: {} files for {} ranks", files.size(), s.world);
  std::vector<StateFile> in(files.size());
  std::vector<std::vector<UnitSpec>> specs;
  for (int r = 0; r < s.world; ++r) {
    specs.push_back(rank_unit_specs(full, s, r));
    open_state(in[size_t(r)], files[size_t(r)], specs.back());
    LT_CHECK(in[size_t(r)].step == in[0].step, "merge_state_shards: {} is at step {}, {} at step {}",
             files[size_t(r)].string(), in[size_t(r)].step, files[0].string(), in[0].step);
  }
  Out out(out_path);
  out.header(in[0], full);
  std::vector<char> buf(1 << 20);
  for (size_t u = 0; u < full.size(); ++u)
    for (const auto& t : full[u].tensors) {
      const auto kinds = part_kinds(t.format);
      for (size_t k = 0; k < kinds.size(); ++k) {
        int64_t covered = 0;
        for (int r = 0; r < s.world; ++r) {
          const int i = find_tensor(specs[size_t(r)][u], t.name);
          if (i < 0) continue;
          const auto& piece = specs[size_t(r)][u].tensors[size_t(i)];
          int64_t off = 0;
          for (size_t j = 0; j < k; ++j) off += part_bytes(kinds[j], piece.numel);
          copy_bytes(in[size_t(r)], in[size_t(r)].pos[u][size_t(i)] + off, part_bytes(kinds[k], piece.numel), out.out,
                     out.h, buf);
          covered += piece.numel;
        }
        LT_CHECK(covered == t.numel, "merge_state_shards: tensor '{}' pieces cover {} of {} elements", t.name, covered,
                 t.numel);
      }
    }
  out.commit();
}

void split_state_file(const fs::path& full_file, const std::vector<UnitSpec>& full, const ShardLayout& s, int rank,
                      const fs::path& out_path) {
  StateFile in;
  open_state(in, full_file, full);
  const auto spec = rank_unit_specs(full, s, rank);
  Out out(out_path);
  out.header(in, spec);
  std::vector<char> buf(1 << 20);
  for (size_t u = 0; u < spec.size(); ++u) {
    const int64_t lo = s.lo(int64_t(u), rank);
    for (const auto& piece : spec[u].tensors) {
      const int i = find_tensor(full[u], piece.name);
      LT_CHECK(i >= 0, "split_state_file: tensor '{}' not in unit {}", piece.name, u);
      const auto& t = full[u].tensors[size_t(i)];
      const int64_t a = piece.offset + lo - t.offset;  // first element of the piece within the tensor
      const auto kinds = part_kinds(t.format);
      int64_t off = 0;
      for (int k : kinds) {
        auto [b, n] = part_slice(k, a, piece.numel);
        copy_bytes(in, in.pos[u][size_t(i)] + off + b, n, out.out, out.h, buf);
        off += part_bytes(k, t.numel);
      }
    }
  }
  out.commit();
}

}  // namespace lt::dist
