#include "dist/state_shards.h"

#include <algorithm>
#include <memory>
#include <string>

#include "core/error.h"
#include "optim/state_io.h"

namespace lt::dist {
namespace fs = std::filesystem;
using optim::StateFormat;
using optim::UnitSpec;

namespace {

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

// A state file checked against the expected layout (both checksums), with each tensor's payload offset.
struct StateFile {
  optim::StateReader in;
  optim::StateHeader header;
  std::vector<std::vector<int64_t>> pos;  // [unit][tensor] payload start offset in the file
  StateFile(const fs::path& path, const std::vector<UnitSpec>& expect) : in(path) {
    header = in.header(expect);
    int64_t at = int64_t(in.pos());
    pos.resize(expect.size());
    for (size_t u = 0; u < expect.size(); ++u)
      for (const auto& t : expect[u].tensors) {
        pos[u].push_back(at);
        at += optim::state_bytes(t.numel, t.format);
      }
    in.verify_payload();
  }
};

void copy_bytes(StateFile& f, int64_t at, int64_t n, optim::StateWriter& out, std::vector<char>& buf) {
  while (n > 0) {
    const int64_t k = std::min<int64_t>(n, int64_t(buf.size()));
    f.in.read_at(uint64_t(at), buf.data(), size_t(k));
    out.raw(buf.data(), size_t(k));
    n -= k;
    at += k;
  }
}

int find_tensor(const UnitSpec& u, const std::string& name) {
  for (size_t i = 0; i < u.tensors.size(); ++i)
    if (u.tensors[i].name == name) return int(i);
  return -1;
}

}  // namespace

void merge_state_shards(const std::vector<fs::path>& files, const std::vector<UnitSpec>& full, const ShardLayout& s,
                        const fs::path& out_path) {
  LT_CHECK(int(files.size()) == s.world, "merge_state_shards: {} files for {} ranks", files.size(), s.world);
  std::vector<std::unique_ptr<StateFile>> in;
  std::vector<std::vector<UnitSpec>> specs;
  for (int r = 0; r < s.world; ++r) {
    specs.push_back(rank_unit_specs(full, s, r));
    in.push_back(std::make_unique<StateFile>(files[size_t(r)], specs.back()));
    LT_CHECK(in.back()->header.step == in[0]->header.step, "merge_state_shards: {} is at step {}, {} at step {}",
             files[size_t(r)].string(), in.back()->header.step, files[0].string(), in[0]->header.step);
  }
  optim::StateWriter out(out_path);
  out.header(in[0]->header, full);
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
          copy_bytes(*in[size_t(r)], in[size_t(r)]->pos[u][size_t(i)] + off, part_bytes(kinds[k], piece.numel), out,
                     buf);
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
  StateFile in(full_file, full);
  const auto spec = rank_unit_specs(full, s, rank);
  optim::StateWriter out(out_path);
  out.header(in.header, spec);
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
        copy_bytes(in, in.pos[u][size_t(i)] + off + b, n, out, buf);
        off += part_bytes(k, t.numel);
      }
    }
  }
  out.commit();
}

}  // namespace lt::dist
