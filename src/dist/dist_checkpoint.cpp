#include "dist/dist_checkpoint.h"

#include <unistd.h>

#include <fmt/format.h>

#include "core/error.h"
#include "dist/state_shards.h"
#include "io/model_io.h"

namespace lt::dist {
namespace fs = std::filesystem;

namespace {
void check(const DistModel& m) {
  LT_CHECK(m.model && m.layout && m.state && m.shard_opt && m.full_specs && m.shards,
           "dist checkpoint: DistModel has an unset field");
}
std::vector<const float*> masters(HostState& st) {
  std::vector<const float*> v;
  for (int64_t u = 0; u < st.units(); ++u) v.push_back(st.master(u));
  return v;
}
}  // namespace

void save_dist_checkpoint(const fs::path& dir, Communicator& comm, ShardedUpdateHook& hook, const DistModel& m) {
  check(m);
  hook.gather_masters();
  const fs::path ts = dir / "trainer_state";
  if (comm.rank() == 0) fs::create_directories(ts);
  comm.barrier();
  const fs::path mine = ts / fmt::format("optimizer.rank{}-of-{}.bin", comm.rank(), comm.size());
  m.shard_opt->save(mine);
  comm.barrier();
  // Rank 0 writes everything else; a failure there must reach the other ranks too.
  int64_t ok = 1;
  std::string err;
  if (comm.rank() == 0) {
    try {
      std::vector<fs::path> files;
      for (int r = 0; r < comm.size(); ++r) files.push_back(ts / fmt::format("optimizer.rank{}-of-{}.bin", r, comm.size()));
      merge_state_shards(files, *m.full_specs, *m.shards, ts / "optimizer.bin");
      for (auto& f : files) fs::remove(f);
      SaveOptions bf16;
      bf16.dtype = DType::BF16;
      save_model(dir, *m.model, *m.layout, masters(*m.state), bf16);
      SaveOptions f32;
      f32.dtype = DType::F32;
      save_model(ts / "master", *m.model, *m.layout, masters(*m.state), f32);
    } catch (const std::exception& e) {
      ok = 0;
      err = e.what();
    }
  }
  comm.broadcast(&ok, 1, CommType::I64, 0);
  if (!ok) fail("dist checkpoint {}: {}", dir.string(), comm.rank() == 0 ? err : std::string("rank 0 failed"));
}

void load_dist_checkpoint(const fs::path& dir, Communicator& comm, const DistModel& m) {
  check(m);
  HostState& st = *m.state;
  std::vector<float*> mp;
  for (int64_t u = 0; u < st.units(); ++u) mp.push_back(st.master(u));
  load_weights(dir / "trainer_state" / "master", *m.model, *m.layout, mp);
  st.refresh_all_streams();
  const fs::path tmp = fs::temp_directory_path() /
                       fmt::format("lt-dist-{}-rank{}-of-{}.optimizer.bin", ::getpid(), comm.rank(), comm.size());
  try {
    split_state_file(dir / "trainer_state" / "optimizer.bin", *m.full_specs, *m.shards, comm.rank(), tmp);
    m.shard_opt->load(tmp);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  fs::remove(tmp);
  comm.barrier();
}

}  // namespace lt::dist
