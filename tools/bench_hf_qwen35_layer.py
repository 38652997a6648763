#!/usr/bin/env python3
"""HF baseline for bench/gpu/bench_qwen35_layer.cpp: transformers' Qwen3_5DecoderLayer at the Qwen3.6-27B
shape (hidden 5120, ffn 17408, 24/4 heads of head_dim 256, partial RoPE 0.25, output gate; Gated DeltaNet
16 key / 48 value heads of 128, conv 4), batch 8 x 1024, bf16, on one GPU: forward, and forward+backward
(out.backward(dy)) of a linear-attention and a full-attention layer in the same call. The full layer
uses SDPA; the linear layer uses whatever transformers picks (the PyTorch fallback of the chunked delta
rule and of the causal conv when flash-linear-attention / causal-conv1d are not usable). Also forward+backward
with activation checkpointing (torch.utils.checkpoint: the backward recomputes the layer's forward), which is
what a training step with gradient checkpointing does per layer, and what lazytrain's fwd + layer_backward does.
Prints ms and writes JSON lines (--json) in the format of bench_qwen35_layer --json (ckpt_fwd_bwd_ms added).
"""
import argparse
import json
import statistics

import torch
import torch.utils.checkpoint


def median_time(fn, warm, reps):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def config(mq_cfg):
    half = int(256 * 0.25) // 2
    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
            "mrope_section": [half - 2 * (half // 4), half // 4, half // 4], "mrope_interleaved": True}
    cfg = mq_cfg(vocab_size=1024, hidden_size=5120, intermediate_size=17408, num_hidden_layers=2,
                 num_attention_heads=24, num_key_value_heads=4, head_dim=256, rms_norm_eps=1e-6,
                 max_position_embeddings=262144, rope_parameters=rope, linear_conv_kernel_dim=4,
                 linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                 linear_num_value_heads=48, layer_types=["linear_attention", "full_attention"])
    cfg._attn_implementation = "sdpa"
    return cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default="")
    ap.add_argument("--profile", action="store_true",
                    help="after the timing, one forward+backward per layer under torch.profiler: the CUDA kernels "
                         "by total time")
    a = ap.parse_args()

    import transformers
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

    torch.manual_seed(0)
    cfg = config(Qwen3_5TextConfig)
    B, S = a.batch, a.seq
    rope = mq.Qwen3_5TextRotaryEmbedding(config=cfg).cuda()
    x = torch.randn(B, S, cfg.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    pos = torch.arange(S, device="cuda")[None, None, :].expand(3, B, S)
    cos, sin = rope(x, pos)
    dy = torch.randn_like(x) * 0.01
    print(f"bench_hf_qwen35_layer: {torch.cuda.get_device_name()}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}, batch {B} x seq {S}, bf16", flush=True)
    res = {}
    for idx, kind in enumerate(cfg.layer_types):
        layer = mq.Qwen3_5DecoderLayer(cfg, layer_idx=idx).cuda().to(torch.bfloat16)

        def fwd(xx):
            out = layer(xx, position_embeddings=(cos, sin), attention_mask=None, position_ids=pos[0])
            return out[0] if isinstance(out, tuple) else out

        def run(backward):
            out = fwd(x)
            if backward:
                out.backward(dy)
            return out

        def run_ckpt():
            torch.utils.checkpoint.checkpoint(fwd, x, use_reentrant=False).backward(dy)

        with torch.no_grad():
            tf = median_time(lambda: run(False), a.warmup, a.reps)
        tfb = median_time(lambda: run(True), a.warmup, a.reps)
        tck = median_time(run_ckpt, a.warmup, a.reps)
        res[kind] = (tf, tfb)
        print(f"  {kind:18s} fwd {tf:8.2f} ms   fwd+bwd {tfb:8.2f} ms   fwd+bwd with checkpointing {tck:8.2f} ms",
              flush=True)
        if a.profile:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                run(True)
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=90),
                  flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps({"bench": "qwen35_layer", "impl": "hf", "kind": kind, "batch": B, "seq": S,
                                    "fwd_ms": tf, "fwd_bwd_ms": tfb, "ckpt_fwd_bwd_ms": tck}) + "\n")
        del layer
        x.grad = None
        torch.cuda.empty_cache()
    print(f"  ratio linear/full (fwd+bwd): {res['linear_attention'][1] / res['full_attention'][1]:.3f}")


if __name__ == "__main__":
    main()
