#include "dist/communicator.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace lt::dist {

namespace {
template <typename T>
void sum_typed(const std::vector<const char*>& src, char* out, int64_t count) {
  T* o = reinterpret_cast<T*>(out);
  for (int64_t i = 0; i < count; ++i) {
    T acc = reinterpret_cast<const T*>(src[0])[i];
    for (size_t q = 1; q < src.size(); ++q) acc += reinterpret_cast<const T*>(src[q])[i];
    o[i] = acc;
  }
}
}  // namespace

void sum_in_rank_order(const std::vector<const char*>& src, char* out, int64_t count, CommType t) {
  switch (t) {
    case CommType::F32: return sum_typed<float>(src, out, count);
    case CommType::F64: return sum_typed<double>(src, out, count);
    case CommType::I64: return sum_typed<int64_t>(src, out, count);
    case CommType::BF16: fail("sum: bf16 reduction is not supported (reduce in fp32)");
  }
}

size_t comm_type_size(CommType t) {
  switch (t) {
    case CommType::F32: return 4;
    case CommType::F64: return 8;
    case CommType::I64: return 8;
    case CommType::BF16: return 2;
  }
  fail("comm: unknown element type {}", int(t));
}

const char* comm_type_name(CommType t) {
  switch (t) {
    case CommType::F32: return "f32";
    case CommType::F64: return "f64";
    case CommType::I64: return "i64";
    case CommType::BF16: return "bf16";
  }
  return "?";
}

void check_bounds(const std::vector<int64_t>& b, int world, const char* op) {
  LT_CHECK(int(b.size()) == world + 1, "{}: bounds: expected {} offsets for {} ranks, got {}", op, world + 1, world,
           b.size());
  LT_CHECK(b[0] == 0, "{}: bounds[0]: expected 0, got {}", op, b[0]);
  for (int r = 0; r < world; ++r)
    LT_CHECK(b[size_t(r)] <= b[size_t(r) + 1], "{}: bounds must not decrease: bounds[{}]={} > bounds[{}]={}", op, r,
             b[size_t(r)], r + 1, b[size_t(r) + 1]);
}

std::vector<int64_t> even_bounds(int64_t n, int world) {
  LT_CHECK(world >= 1 && n >= 0, "even_bounds: expected world >= 1 and n >= 0, got world {} n {}", world, n);
  const int64_t per = (n + world - 1) / world;
  std::vector<int64_t> b(size_t(world) + 1);
  for (int r = 0; r <= world; ++r) b[size_t(r)] = std::min<int64_t>(n, per * r);
  return b;
}

namespace {
class SoloCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "solo"; }
  void all_reduce(void*, int64_t, CommType) override {}
  void reduce_scatter(void*, const std::vector<int64_t>& b, CommType) override { check_bounds(b, 1, "reduce_scatter"); }
  void all_gather(void*, const std::vector<int64_t>& b, CommType) override { check_bounds(b, 1, "all_gather"); }
  void broadcast(void*, int64_t, CommType, int root) override {
    LT_CHECK(root == 0, "broadcast: root {} out of range [0, 1)", root);
  }
  void barrier() override {}
};
}  // namespace

std::unique_ptr<Communicator> solo_communicator() { return std::make_unique<SoloCommunicator>(); }

namespace {
int env_int(const char* name, int dflt, bool* present = nullptr) {
  const char* v = std::getenv(name);
  if (present) *present = v != nullptr;
  if (!v) return dflt;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  LT_CHECK(end != v && *end == '\0' && x >= 0 && x < (1 << 20), "environment {}: expected a non-negative integer, got '{}'",
           name, v);
  return int(x);
}
}  // namespace

double comm_timeout_from_environment() {
  const char* v = std::getenv("LT_COMM_TIMEOUT_S");
  if (!v) return 300;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  LT_CHECK(end != v && *end == '\0' && x > 0, "environment LT_COMM_TIMEOUT_S: expected a positive number of seconds, got '{}'",
           v);
  return x;
}

DistEnv dist_env_from_environment() {
  DistEnv e;
  bool have_world = false;
  e.world = env_int("LT_WORLD_SIZE", 1, &have_world);
  e.rank = env_int("LT_RANK", 0);
  e.local_rank = env_int("LT_LOCAL_RANK", e.rank);
  if (const char* d = std::getenv("LT_RDZV_DIR")) e.rdzv_dir = d;
  e.launched = have_world;
  LT_CHECK(e.world >= 1, "environment LT_WORLD_SIZE: expected >= 1, got {}", e.world);
  LT_CHECK(e.rank < e.world, "environment LT_RANK: expected < LT_WORLD_SIZE ({}), got {}", e.world, e.rank);
  LT_CHECK(e.world == 1 || !e.rdzv_dir.empty(),
           "environment LT_RDZV_DIR: required when LT_WORLD_SIZE > 1 (start the ranks with `lazytrain launch -n N`)");
  return e;
}

}  // namespace lt::dist
