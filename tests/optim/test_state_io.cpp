// Optimizer state save/load: exact round trip (fp32 and 8-bit codes + scales), resumed training equals
// uninterrupted training, and bad files give clear errors.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "helpers.h"

using namespace lt::optim;
using namespace lt::optim::test;
namespace fs = std::filesystem;

namespace {

struct Fixture {
  std::vector<UnitSpec> specs{make_unit({700, 64}, {StateFormat::Q8, StateFormat::F32}, {0, 1}),
                              make_unit({1500}, {StateFormat::F32}, {0})};
  std::vector<std::vector<float>> p{randn(specs[0].numel, 1), randn(specs[1].numel, 2)};
  std::vector<UnitBuffers> bufs(std::vector<std::vector<float>>& g) {
    return {{p[0].data(), g[0].data(), nullptr}, {p[1].data(), g[1].data(), nullptr}};
  }
};

std::vector<std::vector<float>> grads(int step) {
  Fixture f;
  return {randn(f.specs[0].numel, 90 + step, 0.1f), randn(f.specs[1].numel, 190 + step, 0.1f)};
}

fs::path tmpfile(const std::string& name) {
  return fs::temp_directory_path() / ("lt_optim_test_" + std::to_string(::getpid()) + "_" + name);
}

std::string error_of(CpuAdamW& opt, const fs::path& f) {
  try {
    opt.load(f);
  } catch (const lt::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(StateIO, SaveLoadIsExactAndResumeMatches) {
  AdamWConfig cfg;
  cfg.threads = 2;
  Fixture a, b;
  CpuAdamW oa(a.specs, cfg);
  for (int s = 1; s <= 3; ++s) {
    auto g = grads(s);
    oa.step(1e-3f, a.bufs(g));
  }
  fs::path file = tmpfile("exact.bin");
  oa.save(file);
  CpuAdamW ob(b.specs, cfg);
  b.p = a.p;
  ob.load(file);
  EXPECT_EQ(ob.step_count(), 3);
  for (int u = 0; u < 2; ++u)
    for (size_t t = 0; t < a.specs[size_t(u)].tensors.size(); ++t) {
      std::vector<float> m0, v0, m1, v1;
      oa.read_state(u, int(t), m0, v0);
      ob.read_state(u, int(t), m1, v1);
      EXPECT_EQ(m0, m1);
      EXPECT_EQ(v0, v1);
    }
  // Saving the loaded state reproduces the file byte for byte.
  fs::path file2 = tmpfile("exact2.bin");
  ob.save(file2);
  std::ifstream f1(file, std::ios::binary), f2(file2, std::ios::binary);
  std::string s1((std::istreambuf_iterator<char>(f1)), {}), s2((std::istreambuf_iterator<char>(f2)), {});
  EXPECT_EQ(s1, s2);
  // Continue both for two steps: identical weights.
  for (int s = 4; s <= 5; ++s) {
    auto g = grads(s);
    oa.step(1e-3f, a.bufs(g));
    auto g2 = grads(s);
    ob.step(1e-3f, b.bufs(g2));
  }
  EXPECT_EQ(a.p, b.p);
  fs::remove(file);
  fs::remove(file2);
}

TEST(StateIO, BadFilesAreRejectedClearly) {
  AdamWConfig cfg;
  cfg.threads = 1;
  Fixture a;
  CpuAdamW opt(a.specs, cfg);
  auto g = grads(1);
  opt.step(1e-3f, a.bufs(g));
  fs::path file = tmpfile("bad.bin");
  opt.save(file);
  std::string good;
  {
    std::ifstream in(file, std::ios::binary);
    good.assign((std::istreambuf_iterator<char>(in)), {});
  }
  auto write = [&](const std::string& s) {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(s.data(), std::streamsize(s.size()));
  };
  CpuAdamW fresh(a.specs, cfg);
  write(good.substr(0, good.size() - 100));
  EXPECT_NE(error_of(fresh, file).find("truncated"), std::string::npos) << error_of(fresh, file);
  write(good.substr(0, 20));
  EXPECT_NE(error_of(fresh, file).find("truncated"), std::string::npos) << error_of(fresh, file);
  std::string bad = good;
  bad[bad.size() - 50] ^= 0x5a;  // payload byte
  write(bad);
  EXPECT_NE(error_of(fresh, file).find("checksum mismatch"), std::string::npos) << error_of(fresh, file);
  EXPECT_EQ(fresh.step_count(), 0);  // nothing committed
  bad = good;
  bad[0] = 'X';
  write(bad);
  EXPECT_NE(error_of(fresh, file).find("bad magic"), std::string::npos);
  // A different layout (8-bit tensor now fp32) is a mismatch naming the tensor.
  write(good);
  auto specs = a.specs;
  specs[0].tensors[0].format = StateFormat::F32;
  CpuAdamW other(specs, cfg);
  std::string e = error_of(other, file);
  EXPECT_NE(e.find("t0"), std::string::npos) << e;
  EXPECT_NE(e.find("format"), std::string::npos) << e;
  EXPECT_NE(error_of(fresh, tmpfile("missing.bin")).find("cannot open"), std::string::npos);
  fs::remove(file);
}

// A write that fails (here ENOSPC: the temporary file is a link to /dev/full, as on a full disk) names the file and
// the OS reason, and leaves no optimizer.bin behind.
TEST(StateIO, WriteFailureNamesTheFileAndTheReason) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  AdamWConfig cfg;
  cfg.threads = 1;
  Fixture a;
  CpuAdamW opt(a.specs, cfg);
  auto g = grads(1);
  opt.step(1e-3f, a.bufs(g));
  const fs::path dir = tmpfile("full");
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::create_symlink("/dev/full", dir / "optimizer.bin.tmp");
  std::string e;
  try {
    opt.save(dir / "optimizer.bin");
  } catch (const lt::Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("optimizer.bin.tmp"), std::string::npos) << e;
  EXPECT_NE(e.find("write failed"), std::string::npos) << e;
  EXPECT_NE(e.find(std::strerror(ENOSPC)), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir / "optimizer.bin"));
  fs::remove_all(dir);
}
