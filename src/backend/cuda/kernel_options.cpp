#include "backend/cuda/kernel_options.h"

#include <fmt/format.h>

#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>

#include "backend/cuda/attention/attention_variants.h"
#include "core/error.h"

namespace lt::cuda {

namespace {
// Each enum's values in its order: the environment's spellings and describe()'s.
constexpr const char* kAttnPath[] = {"cudnn", "own"};
constexpr const char* kHd256[] = {"flash", "generic"};
constexpr const char* kGdnRule[] = {"chunked", "mma", "simt"};
constexpr const char* kGdnPrecision[] = {"split", "bf16"};
constexpr const char* kGdnRuleFwd[] = {"chunked", "mma"};
constexpr const char* kGdnPasses[] = {"tile", "warp"};
constexpr const char* kGdnGrads[] = {"frag", "bf16"};
constexpr const char* kGdnSched[] = {"all", "none", "prep", "grads"};
constexpr const char* kNormBwd[] = {"fused", "split"};
constexpr const char* kOffOn[] = {"0", "1"};
constexpr const char* kGradsCta[] = {"256", "384", "512"};
constexpr int kGradsCtaValues[] = {256, 384, 512};
constexpr const char* kGradsTile[] = {"16", "32"};
constexpr int kGradsTileValues[] = {16, 32};

// The variable's value; null when unset or empty.
const char* env(const char* var) {
  const char* e = std::getenv(var);
  return e && *e ? e : nullptr;
}

template <size_t N>
std::string joined(const char* const (&names)[N]) {
  std::string s;
  for (size_t i = 0; i < N; ++i) s += (i ? ", " : "") + std::string(names[i]);
  return s;
}

// The index of `var`'s value among `names`, `def` when unset; any other value throws.
template <size_t N>
int choice(const char* var, const char* const (&names)[N], int def) {
  const char* e = env(var);
  if (!e) return def;
  for (size_t i = 0; i < N; ++i)
    if (std::strcmp(e, names[i]) == 0) return int(i);
  fail("{}='{}': expected one of {}", var, e, joined(names));
}

template <typename E, size_t N>
void read(E& field, const char* var, const char* const (&names)[N]) {
  field = E(choice(var, names, int(field)));
}
void read(bool& field, const char* var) { field = choice(var, kOffOn, field ? 1 : 0) == 1; }

// An attention kernel variant 0..count-1 (attention_variants.h), or -1 when `e` is not a number.
int variant_of(const char* e, int count) {
  int v = -1;
  const char* end = e + std::strlen(e);
  const auto [p, ec] = std::from_chars(e, end, v);
  return ec == std::errc() && p == end && v >= 0 && v < count ? v : -1;
}

void read_attention(KernelOptions& o) {
  read(o.attention, "LT_ATTN", kAttnPath);
  read(o.attention_packed, "LT_ATTN_PACKED", kAttnPath);
  read(o.attention_deterministic, "LT_ATTN_DETERMINISTIC");
  read(o.attention_hd256, "LT_ATTN_HD256", kHd256);
  if (const char* e = env("LT_ATTN_FWD")) {
    o.attention_fwd_variant = variant_of(e, attention_fwd_variant_count());
    LT_CHECK(o.attention_fwd_variant >= 0, "LT_ATTN_FWD='{}': expected a forward kernel variant 0..{}", e,
             attention_fwd_variant_count() - 1);
  }
  // LT_ATTN_BWD is a path (cudnn, own) or our backward's variant (a number; the path stays cuDNN's).
  if (const char* e = env("LT_ATTN_BWD")) {
    if (std::strcmp(e, "own") == 0 || std::strcmp(e, "cudnn") == 0) return read(o.attention_bwd, "LT_ATTN_BWD", kAttnPath);
    o.attention_bwd_variant = variant_of(e, attention_bwd_variant_count());
    LT_CHECK(o.attention_bwd_variant >= 0, "LT_ATTN_BWD='{}': expected cudnn, own or a backward kernel variant 0..{}",
             e, attention_bwd_variant_count() - 1);
  }
}

void read_gdn(KernelOptions& o) {
  bool simt = false;
  read(simt, "LT_GDN_SIMT");  // the older spelling of LT_GDN_RULE=simt
  if (simt) o.gdn_rule = GdnRuleImpl::Simt;
  read(o.gdn_rule, "LT_GDN_RULE", kGdnRule);
  read(o.gdn_rule_fwd, "LT_GDN_RULE_FWD", kGdnRuleFwd);
  read(o.gdn_precision, "LT_GDN_PRECISION", kGdnPrecision);
  read(o.gdn_passes, "LT_GDN_PASS", kGdnPasses);
  read(o.gdn_grads, "LT_GDN_GRADS", kGdnGrads);
  o.gdn_grads_cta = kGradsCtaValues[choice("LT_GDN_GRADS_CTA", kGradsCta, 2)];
  o.gdn_grads_tile = kGradsTileValues[choice("LT_GDN_GRADS_TILE", kGradsTile, 1)];
  read(o.gdn_sched, "LT_GDN_SCHED", kGdnSched);
}

std::string variant_name(int v) { return v < 0 ? "default" : std::to_string(v); }

std::mutex g_mu;
std::atomic<const KernelOptions*> g_current{nullptr};
// Every distinct value installed so far, kept alive so that a reference from kernel_options() outlives a later
// set_kernel_options (tests and benchmarks install a handful). Under g_mu.
const KernelOptions* keep(const KernelOptions& o) {
  static std::deque<KernelOptions> installed;
  const std::string key = o.describe();
  for (const KernelOptions& k : installed)
    if (k.describe() == key) return &k;
  installed.push_back(o);
  return &installed.back();
}
}  // namespace

KernelOptions KernelOptions::from_environment() {
  KernelOptions o;
  read_attention(o);
  read_gdn(o);
  read(o.norm_bwd, "LT_NORM_BWD", kNormBwd);
  read(o.check_finite, "LT_CHECK_FINITE");
  return o;
}

void KernelOptions::validate() const {
  LT_CHECK(attention_fwd_variant >= -1 && attention_fwd_variant < attention_fwd_variant_count(),
           "kernel options: attention_fwd_variant {} (expected -1..{})", attention_fwd_variant,
           attention_fwd_variant_count() - 1);
  LT_CHECK(attention_bwd_variant >= -1 && attention_bwd_variant < attention_bwd_variant_count(),
           "kernel options: attention_bwd_variant {} (expected -1..{})", attention_bwd_variant,
           attention_bwd_variant_count() - 1);
  LT_CHECK(gdn_grads_cta == 256 || gdn_grads_cta == 384 || gdn_grads_cta == 512,
           "kernel options: gdn_grads_cta {} (expected 256, 384 or 512)", gdn_grads_cta);
  LT_CHECK(gdn_grads_tile == 16 || gdn_grads_tile == 32, "kernel options: gdn_grads_tile {} (expected 16 or 32)",
           gdn_grads_tile);
}

std::string KernelOptions::describe() const {
  return fmt::format(
      "kernels: attention={} packed={} bwd={} deterministic={} own_variants=fwd:{},bwd:{} hd256={} gdn_rule={} "
      "gdn_rule_fwd={} gdn_precision={} gdn_pass={} gdn_grads={} gdn_grads_cta={} gdn_grads_tile={} gdn_sched={} "
      "norm_bwd={} check_finite={}",
      kAttnPath[int(attention)], kAttnPath[int(attention_packed)], kAttnPath[int(attention_bwd)],
      attention_deterministic ? "on" : "off", variant_name(attention_fwd_variant), variant_name(attention_bwd_variant),
      kHd256[int(attention_hd256)], kGdnRule[int(gdn_rule)], kGdnRuleFwd[int(gdn_rule_fwd)],
      kGdnPrecision[int(gdn_precision)], kGdnPasses[int(gdn_passes)], kGdnGrads[int(gdn_grads)], gdn_grads_cta,
      gdn_grads_tile, kGdnSched[int(gdn_sched)], kNormBwd[int(norm_bwd)], check_finite ? "on" : "off");
}

const KernelOptions& kernel_options() {
  if (const KernelOptions* p = g_current.load(std::memory_order_acquire)) return *p;
  const KernelOptions from_env = KernelOptions::from_environment();  // throws on a bad value, before the lock
  std::lock_guard lk(g_mu);
  if (!g_current.load(std::memory_order_relaxed)) g_current.store(keep(from_env), std::memory_order_release);
  return *g_current.load(std::memory_order_relaxed);
}

void set_kernel_options(const KernelOptions& o) {
  o.validate();
  std::lock_guard lk(g_mu);
  g_current.store(keep(o), std::memory_order_release);
}

}  // namespace lt::cuda
