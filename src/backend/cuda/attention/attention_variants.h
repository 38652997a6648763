// Kernel variants of the tensor-core attention (attention.cu), for benchmarks and tests: each run of one GPU call
// can time and check all of them. KernelOptions::attention_fwd_variant / attention_bwd_variant (kernel_options.h;
// env LT_ATTN_FWD / LT_ATTN_BWD) pick one; -1 selects the default (the measured fastest).
#pragma once

namespace lt::cuda {

int attention_fwd_variant_count();
int attention_bwd_variant_count();
const char* attention_bwd_variant_name(int v);

}  // namespace lt::cuda
