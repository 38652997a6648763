// Causal GQA attention on cuDNN's fused flash-attention (SDPA) engines, through the cuDNN frontend's graph
// API. On sm_90 these are Hopper kernels (wgmma + TMA, warp-specialised producer/consumer pipelines, the
// FlashAttention-3 design); our own kernels (attention.cu) remain the reference and the fallback: for shapes cuDNN
// declines (one-row sequences), packed rows whose runs were not counted, a packed batch wanting more backward
// workspace than its caller carved, LT_ATTN=own, and builds without the cuDNN frontend (scripts/fetch-cudnn-frontend).
//
// Same tensors as attention_fwd/attention_bwd (kernels.h): q/o/dq [T, heads*hd], k/v/dk/dv [T, kv_heads*hd],
// bf16, T = batch*seq, sample-major rows.
//   Unpacked rows (no segments): each sample is one causal sequence. The softmax statistics are fp32
//     [batch, heads, seq], not our kernels' [T, heads]: a forward and its backward must take the same path,
//     which the usable() answer (cached per shape) makes sure of.
//   Packed rows (segments): every run of equal segment ids within a sample is one causal sequence (cuDNN's
//     ragged "THD" layout, a padding mask with per-run lengths). The host counts the runs and the longest
//     (DevGeometry::runs/longest_run); the graph is built for them rounded up (run slots beyond the count
//     have length 0). The statistics are [T, heads] and mean what our kernels' lse means, so a packed forward
//     on cuDNN may be followed by our backward (the mixer does so when a batch's graph wants more workspace
//     than it carved: cuDNN 9.19 sizes that by the run slots x the longest run).
// Selection (KernelOptions::attention, env LT_ATTN): "cudnn" (default where compiled) or "own".
// KernelOptions::attention_deterministic = false (LT_ATTN_DETERMINISTIC=0) lets cuDNN's backward accumulate dQ with
// atomics (faster, not bit-reproducible); the default is its deterministic algorithm, so that a step, a
// kept-internals backward and a re-run give the same bits.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/cuda/kernels.h"

namespace lt::cuda {

// Packed rows: the device segment ids and the host-counted runs; `index` is device scratch of
// packed_index_ints(T) int32 (the kernels rebuild it from the segments on every call).
struct PackedRows {
  const int32_t* segments = nullptr;
  int64_t runs = 0, longest = 0;
  int32_t* index = nullptr;
};
int64_t packed_index_ints(int64_t tokens);

// True when this build has the cuDNN path.
bool cudnn_attention_built();
// True when this build has the cuDNN path and kernel_options() does not turn it off (attention=own).
bool cudnn_attention_enabled();
// True when the cuDNN forward and backward graphs for these dims (packed: nullptr for unpacked rows) build on
// this device (cached per shape and device; a first build takes tens of ms).
bool cudnn_attention_usable(const AttnDims& d, const PackedRows* packed = nullptr);
// Workspace bytes the backward's graph needs (0 when cuDNN declines the shape). The callers carve it in their
// scratch: 1-4x the fp32 dQ (padded to 128 rows, more for GQA with the deterministic backward, e.g. 4.5 MB
// against 1.1 MB at 300 rows x 14 heads of 64, 2 KV heads; H200, cuDNN 9.19).
size_t cudnn_attention_bwd_workspace(const AttnDims& d, const PackedRows* packed = nullptr);

// Both throw lt::Error on a cuDNN failure (after usable() said yes) and when workspace_bytes is below
// cudnn_attention_bwd_workspace(d, packed).
void cudnn_attention_fwd(const AttnDims& d, const PackedRows* packed, const void* q, const void* k, const void* v,
                         void* o, float* stats, cudaStream_t st);
void cudnn_attention_bwd(const AttnDims& d, const PackedRows* packed, const void* q, const void* k, const void* v,
                         const void* o, const float* stats, const void* dout, void* dq, void* dk, void* dv,
                         void* workspace, size_t workspace_bytes, cudaStream_t st);

// "cuDNN 9.x.y (frontend 1.a.b), deterministic backward" or why it is off; for logs and benchmarks.
std::string cudnn_attention_describe();

// ---- internal: the ragged index tensors (attention_packed.cu), in `index` as laid out by PackedIndex.
struct PackedIndex {
  int32_t *starts, *q_off, *kv_off, *st_off, *len;  // [slots+1] each (len: [slots])
};
PackedIndex packed_index_layout(const AttnDims& d, int32_t* index);
void packed_attention_index(const AttnDims& d, const int32_t* segments, int slots, const PackedIndex& ix,
                            cudaStream_t st);

}  // namespace lt::cuda
