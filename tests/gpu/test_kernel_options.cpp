// KernelOptions (src/backend/cuda/kernel_options.h): the LT_* variables, their errors, the run header's line and the
// process-wide value. Host code only: runs without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/kernel_options.h"
#include "core/error.h"

namespace lt {
namespace {

using cuda::KernelOptions;

constexpr const char* kVars[] = {"LT_ATTN", "LT_ATTN_PACKED", "LT_ATTN_BWD", "LT_ATTN_FWD", "LT_ATTN_DETERMINISTIC",
                                 "LT_ATTN_HD256", "LT_GDN_SIMT", "LT_GDN_RULE", "LT_GDN_RULE_FWD", "LT_GDN_PRECISION",
                                 "LT_GDN_PASS", "LT_GDN_GRADS", "LT_GDN_GRADS_CTA", "LT_GDN_GRADS_TILE",
                                 "LT_GDN_SCHED", "LT_NORM_BWD", "LT_CHECK_FINITE"};

// Clears every kernel variable for the test and restores the caller's environment after it.
class KernelOptionsEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) {
      const char* e = std::getenv(v);
      saved_.push_back(e ? std::optional<std::string>(e) : std::nullopt);
      ::unsetenv(v);
    }
  }
  void TearDown() override {
    for (size_t i = 0; i < saved_.size(); ++i)
      saved_[i] ? ::setenv(kVars[i], saved_[i]->c_str(), 1) : ::unsetenv(kVars[i]);
  }
  std::vector<std::optional<std::string>> saved_;
};

std::string error_of(const char* var, const char* value) {
  ::setenv(var, value, 1);
  try {
    KernelOptions::from_environment();
  } catch (const Error& e) {
    ::unsetenv(var);
    return e.what();
  }
  ::unsetenv(var);
  return "no error";
}

TEST_F(KernelOptionsEnv, DefaultsAreTheTrainingPathsAndDescribeThemInOneLine) {
  const KernelOptions o = KernelOptions::from_environment();
  EXPECT_EQ(o.describe(), KernelOptions{}.describe());
  EXPECT_EQ(o.describe(),
            "kernels: attention=cudnn packed=cudnn bwd=cudnn deterministic=on own_variants=fwd:default,bwd:default "
            "hd256=flash gdn_rule=chunked gdn_rule_fwd=chunked gdn_precision=bf16 gdn_pass=warp gdn_grads=bf16 "
            "gdn_grads_cta=512 gdn_grads_tile=32 gdn_sched=all norm_bwd=fused check_finite=off");
  ::setenv("LT_ATTN", "", 1);  // empty: unset
  EXPECT_EQ(KernelOptions::from_environment().attention, cuda::AttnPath::Cudnn);
}

TEST_F(KernelOptionsEnv, VariablesSetTheirFields) {
  ::setenv("LT_ATTN", "own", 1);
  ::setenv("LT_ATTN_DETERMINISTIC", "0", 1);
  ::setenv("LT_ATTN_FWD", "0", 1);
  ::setenv("LT_ATTN_BWD", "3", 1);
  ::setenv("LT_GDN_SIMT", "1", 1);
  ::setenv("LT_GDN_GRADS_CTA", "256", 1);
  ::setenv("LT_GDN_GRADS_TILE", "16", 1);
  ::setenv("LT_NORM_BWD", "split", 1);
  ::setenv("LT_CHECK_FINITE", "1", 1);
  KernelOptions o = KernelOptions::from_environment();
  EXPECT_EQ(o.attention, cuda::AttnPath::Own);
  EXPECT_FALSE(o.attention_deterministic);
  EXPECT_EQ(o.attention_fwd_variant, 0);
  EXPECT_EQ(o.attention_bwd_variant, 3);
  EXPECT_EQ(o.attention_bwd, cuda::AttnPath::Cudnn);  // a variant number leaves the path alone
  EXPECT_EQ(o.gdn_rule, cuda::GdnRuleImpl::Simt);
  EXPECT_EQ(o.gdn_grads_cta, 256);
  EXPECT_EQ(o.gdn_grads_tile, 16);
  EXPECT_EQ(o.norm_bwd, cuda::NormBwd::Split);
  EXPECT_TRUE(o.check_finite);
  ::setenv("LT_GDN_RULE", "mma", 1);  // over LT_GDN_SIMT
  ::setenv("LT_ATTN_BWD", "own", 1);
  o = KernelOptions::from_environment();
  EXPECT_EQ(o.gdn_rule, cuda::GdnRuleImpl::Mma);
  EXPECT_EQ(o.attention_bwd, cuda::AttnPath::Own);
  EXPECT_EQ(o.attention_bwd_variant, -1);
}

TEST_F(KernelOptionsEnv, ABadValueNamesTheVariableTheValueAndTheAllowedOnes) {
  const std::string e = error_of("LT_NORM_BWD", "fast");
  EXPECT_NE(e.find("LT_NORM_BWD"), std::string::npos) << e;
  EXPECT_NE(e.find("'fast'"), std::string::npos) << e;
  EXPECT_NE(e.find("fused, split"), std::string::npos) << e;
  EXPECT_NE(error_of("LT_GDN_GRADS_CTA", "128").find("256, 384, 512"), std::string::npos);
  EXPECT_NE(error_of("LT_ATTN_BWD", "99").find("cudnn, own or a backward kernel variant 0.."), std::string::npos);
  EXPECT_NE(error_of("LT_ATTN_FWD", "x").find("LT_ATTN_FWD='x'"), std::string::npos);
  EXPECT_NE(error_of("LT_ATTN_DETERMINISTIC", "yes").find("0, 1"), std::string::npos);
}

TEST_F(KernelOptionsEnv, ScopesInstallAndRestoreTheProcessWideOptions) {
  const std::string before = cuda::kernel_options().describe();
  KernelOptions o = cuda::kernel_options();
  o.gdn_passes = cuda::GdnPasses::Tile;
  {
    const cuda::KernelOptionsScope scope(o);
    EXPECT_EQ(cuda::kernel_options().gdn_passes, cuda::GdnPasses::Tile);
  }
  EXPECT_EQ(cuda::kernel_options().describe(), before);
  o.gdn_grads_cta = 100;
  EXPECT_THROW(cuda::set_kernel_options(o), Error);
  EXPECT_EQ(cuda::kernel_options().describe(), before);
}

}  // namespace
}  // namespace lt
