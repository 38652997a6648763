#!/usr/bin/env python3
"""PyTorch baselines for bench/gpu/bench_cuda_kernels.cpp, same shapes, same machine, same run.

GEMMs: torch.matmul (bf16). Attention: scaled_dot_product_attention with the flash backend (k/v
expanded to all heads outside the timed region, as HF's repeat_kv does). Decoder layer: HF
transformers' Qwen2DecoderLayer in bf16 with SDPA, forward+backward. Writes JSON lines (--json).
"""
import argparse
import json
import statistics

import torch


def median_time(fn, warm=3, reps=10):
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
        ts.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(ts)


OUT = None


def emit(kind, name, seconds, flops):
    print(f"{kind:10s} {name:48s} {seconds * 1e3:10.3f} ms {flops / seconds / 1e12:8.1f} TFLOP/s", flush=True)
    if OUT:
        OUT.write(json.dumps({"impl": "torch", "kind": kind, "name": name, "seconds": seconds,
                              "tflops": flops / seconds / 1e12}) + "\n")
        OUT.flush()


def bench_gemms():
    T = 16384
    shapes = [  # name, trans_a, trans_b, m, n, k (row-major C[m,n] = op(A) op(B))
        ("square_8192", False, True, 8192, 8192, 8192),
        ("7b_qproj_fwd_T16384", False, True, T, 3584, 3584),
        ("7b_gateup_fwd_T16384", False, True, T, 2 * 18944, 3584),
        ("7b_down_fwd_T16384", False, True, T, 3584, 18944),
        ("7b_down_dx_T16384", False, False, T, 18944, 3584),
        ("7b_down_dw_T16384_f32acc", True, False, 3584, 18944, T),
        ("3b_gateup_fwd_T32768", False, True, 32768, 2 * 11008, 2048),
    ]
    for name, ta, tb, m, n, k in shapes:
        a = torch.randn((k, m) if ta else (m, k), device="cuda", dtype=torch.bfloat16)
        b = torch.randn((n, k) if tb else (k, n), device="cuda", dtype=torch.bfloat16)
        A = a.t() if ta else a
        B = b.t() if tb else b
        t = median_time(lambda: torch.matmul(A, B))
        emit("gemm", name, t, 2.0 * m * n * k)
        del a, b


def bench_attention(B, S, H, KV, D):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, KV, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, KV, S, D, device="cuda", dtype=torch.bfloat16)
    ke = k.repeat_interleave(H // KV, dim=1).requires_grad_(True)
    ve = v.repeat_interleave(H // KV, dim=1).requires_grad_(True)
    dO = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
    fwd_flops = 4.0 * B * S * S * H * D / 2
    name = f"B{B}_S{S}_H{H}_KV{KV}_D{D}"
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        f = lambda: torch.nn.functional.scaled_dot_product_attention(q, ke, ve, is_causal=True)
        tf = median_time(f)
        def fb():
            o = torch.nn.functional.scaled_dot_product_attention(q, ke, ve, is_causal=True)
            o.backward(dO)
        tfb = median_time(fb)
    emit("attn_fwd", name, tf, fwd_flops)
    emit("attn_bwd", name, tfb - tf, 2.5 * fwd_flops)
    emit("attn_fwdbwd", name, tfb, 3.5 * fwd_flops)


def bench_layer(B, S):
    from transformers import Qwen2Config
    from transformers.models.qwen2 import modeling_qwen2 as mq
    cfg = Qwen2Config(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
                      num_hidden_layers=1, vocab_size=152064, rms_norm_eps=1e-6, rope_theta=1e6,
                      max_position_embeddings=32768)
    cfg._attn_implementation = "sdpa"
    layer = mq.Qwen2DecoderLayer(cfg, layer_idx=0).cuda().to(torch.bfloat16)
    rope = mq.Qwen2RotaryEmbedding(config=cfg).cuda()
    x = torch.randn(B, S, cfg.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    pos = torch.arange(S, device="cuda").unsqueeze(0).expand(B, S)
    cos, sin = rope(x, pos)
    dy = torch.randn_like(x) * 0.01

    def run(backward):
        out = layer(x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))
        if isinstance(out, tuple):
            out = out[0]
        if backward:
            out.backward(dy)
        return out

    T = B * S
    H, Q, KV, F = cfg.hidden_size, cfg.hidden_size, 512, cfg.intermediate_size
    mm = 2.0 * T * (H * (Q + 2 * KV) + Q * H + 3.0 * H * F)
    at = 4.0 * B * S * S * Q / 2
    with torch.no_grad():
        tf = median_time(lambda: run(False), warm=2, reps=5)
    tfb = median_time(lambda: run(True), warm=2, reps=5)
    name = f"qwen2.5-7b_B{B}_S{S}"
    emit("layer_fwd", name, tf, mm + at)
    emit("layer_fwdbwd", name, tfb, 3 * mm + 3.5 * at)
    print(f"           torch peak memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB", flush=True)


def main():
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--no-gemm", action="store_true")
    ap.add_argument("--no-attn", action="store_true")
    ap.add_argument("--no-layer", action="store_true")
    ap.add_argument("--layer-batch", type=int, default=64)
    ap.add_argument("--layer-seq", type=int, default=1024)
    a = ap.parse_args()
    if a.json:
        OUT = open(a.json, "a")
    print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__, flush=True)
    if not a.no_gemm:
        bench_gemms()
    if not a.no_attn:
        bench_attention(16, 1024, 32, 8, 128)
        bench_attention(16, 1024, 28, 4, 128)
        bench_attention(16, 1024, 14, 2, 64)
        bench_attention(8, 1024, 24, 4, 256)
    if not a.no_layer:
        bench_layer(a.layer_batch, a.layer_seq)


if __name__ == "__main__":
    main()
