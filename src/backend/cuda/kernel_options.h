// Kernel variant choices of the CUDA backend as one value: the attention path, the Gated DeltaNet rule's
// implementation and schedule, the RMSNorm backward, the finiteness probes. The defaults are the measured
// fastest paths, which the training runs take; the other values are comparisons and checks by hand
// (docs/cuda.md, "Non-finite values on the GPU").
//
// KernelOptions::from_environment() reads the LT_* variables below; it is the only reader of them in the backend.
// A CudaBackend holds the value it was created with (CudaBackendOptions::kernels, else kernel_options()), hands
// it to its layers and mixers, prints describe() in the run header and installs it as the process-wide options.
// The kernels' launch functions (attention_fwd, gdn_rule_fwd, rmsnorm_bwd, ...) read that process-wide value
// through kernel_options(): they take dims, pointers and a stream and are called alike from the mixers, the
// tests, the benchmarks and the profiler, so the choice is not one of their arguments.
// C++17-clean (included from .cu files).
#pragma once
#include <string>

namespace lt::cuda {

enum class AttnPath { Cudnn, Own };            // cuDNN's fused attention where it takes the shape, or ours
enum class Hd256Attn { Flash, Generic };       // head_dim 256: our flash kernels (sm_90), or the generic ones
enum class GdnRuleImpl { Chunked, Mma, Simt };  // deltanet.h
enum class GdnRulePrecision { Split, Bf16 };    // deltanet.h
enum class GdnRuleFwd { Chunked, Mma };        // the Chunked implementation's forward: its own, or Mma's
enum class GdnPasses { Tile, Warp };           // the Chunked serial passes: tile passes or register passes
enum class GdnGrads { Frag, Bf16 };            // chunk_grads' operands (register passes): fragments or bf16
enum class GdnSched { All, None, Prep, Grads };  // deltanet/rule.cuh, gdn_sched_flags
enum class NormBwd { Fused, Split };           // rmsnorm_bwd at dim >= 1024: fused column sums, or two kernels

struct KernelOptions {
  AttnPath attention = AttnPath::Cudnn;         // LT_ATTN=cudnn|own
  AttnPath attention_packed = AttnPath::Cudnn;  // LT_ATTN_PACKED=cudnn|own: packed rows only
  AttnPath attention_bwd = AttnPath::Cudnn;     // LT_ATTN_BWD=cudnn|own: own = cuDNN's forward, our backward
  bool attention_deterministic = true;          // LT_ATTN_DETERMINISTIC=1|0: cuDNN's backward without atomics
  int attention_fwd_variant = -1;               // LT_ATTN_FWD=N: our forward's variant (attention_variants.h)
  int attention_bwd_variant = -1;               // LT_ATTN_BWD=N: our backward's variant; -1: the default
  Hd256Attn attention_hd256 = Hd256Attn::Flash;  // LT_ATTN_HD256=flash|generic
  GdnRuleImpl gdn_rule = GdnRuleImpl::Chunked;  // LT_GDN_RULE=chunked|mma|simt (LT_GDN_SIMT=1: simt)
  GdnRuleFwd gdn_rule_fwd = GdnRuleFwd::Chunked;  // LT_GDN_RULE_FWD=chunked|mma
  GdnRulePrecision gdn_precision = GdnRulePrecision::Bf16;  // LT_GDN_PRECISION=split|bf16
  GdnPasses gdn_passes = GdnPasses::Warp;       // LT_GDN_PASS=tile|warp
  GdnGrads gdn_grads = GdnGrads::Bf16;          // LT_GDN_GRADS=frag|bf16
  int gdn_grads_cta = 512;                      // LT_GDN_GRADS_CTA=256|384|512 (threads a CTA)
  int gdn_grads_tile = 32;                      // LT_GDN_GRADS_TILE=16|32 (warp tiles 16 x N)
  GdnSched gdn_sched = GdnSched::All;           // LT_GDN_SCHED=all|none|prep|grads
  NormBwd norm_bwd = NormBwd::Fused;            // LT_NORM_BWD=fused|split
  bool check_finite = false;                    // LT_CHECK_FINITE=0|1 (finite_check.h)

  // The defaults with the LT_* variables applied; an unset or empty variable keeps its default, a value outside
  // the allowed ones throws lt::Error naming the variable, the value and the allowed values.
  static KernelOptions from_environment();
  // Throws lt::Error when a numeric field is outside its allowed values.
  void validate() const;
  // One line for the run header: "kernels: attention=cudnn packed=cudnn bwd=cudnn ...".
  std::string describe() const;
};

// The options the kernels' launch functions read: the last ones installed (set_kernel_options; CudaBackend
// installs its own), else KernelOptions::from_environment(), read at the first call.
const KernelOptions& kernel_options();
// Validates and installs `o` for the whole process. Thread-safe; a reference from kernel_options() stays valid.
void set_kernel_options(const KernelOptions& o);

// For tests and benchmarks: installs `o` for a scope and restores the previous options at its end.
class KernelOptionsScope {
 public:
  explicit KernelOptionsScope(const KernelOptions& o) : prev_(kernel_options()) { set_kernel_options(o); }
  ~KernelOptionsScope() { set_kernel_options(prev_); }
  KernelOptionsScope(const KernelOptionsScope&) = delete;
  KernelOptionsScope& operator=(const KernelOptionsScope&) = delete;

 private:
  KernelOptions prev_;
};

}  // namespace lt::cuda
