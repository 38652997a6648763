// Kernel variants of the tensor-core attention (attention.cu), for benchmarks and tests: each run
// of one GPU call can time and check all of them. -1 selects the default (the measured fastest).
// The environment variables LT_ATTN_FWD / LT_ATTN_BWD set the initial choice.
#pragma once

namespace lt::cuda {

void attention_set_variants(int fwd, int bwd);
int attention_fwd_variant_count();
int attention_bwd_variant_count();
const char* attention_bwd_variant_name(int v);

}  // namespace lt::cuda
