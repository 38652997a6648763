#!/usr/bin/env python3
"""Compares bench_qwen35_layer --json with tools/bench_hf_qwen35_layer.py --json (one file, both appended in the same
GPU call; scripts/gpu-test qwen35) at the Qwen3.6-27B layer shape, on two like-for-like bases:
 (a) one forward + one backward from the layer input: ours is layer_backward (it recomputes the forward internals,
     all but the MLP's down_proj product, whose output the backward does not need: ~2 ms of GEMM at this shape, so
     this basis favours us by that much), HF's is forward + backward with stored activations;
 (b) a training step with activation recompute: ours fwd + layer_backward, HF's forward + backward under
     torch.utils.checkpoint (the backward recomputes the whole forward).
Usage: qwen35_layer_compare.py FILE.jsonl"""
import json
import sys

r = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    r[(j["impl"], j["kind"])] = j
# Two like-for-like bases. (a) one forward + one backward from the layer input: ours is layer_backward (it recomputes
# the forward internals, then runs the backward), HF's is forward + backward. (b) a training step with activation
# recompute: ours fwd + layer_backward, HF's forward + backward under torch.utils.checkpoint.
for kind, target in (("linear_attention", 2.5), ("full_attention", 1.2)):
    ours, hf = r.get(("lazytrain", kind)), r.get(("hf", kind))
    if ours and hf:
        print(f"qwen35 {kind} (a) fwd+bwd: lazytrain {ours['bwd_ms']:.2f} ms, HF {hf['fwd_bwd_ms']:.2f} ms: "
              f"{hf['fwd_bwd_ms'] / ours['bwd_ms']:.2f}x HF (target >= {target}x)")
        if "ckpt_fwd_bwd_ms" in hf:
            print(f"qwen35 {kind} (b) fwd+bwd with recompute: lazytrain {ours['fwd_bwd_ms']:.2f} ms, HF "
                  f"{hf['ckpt_fwd_bwd_ms']:.2f} ms: {hf['ckpt_fwd_bwd_ms'] / ours['fwd_bwd_ms']:.2f}x HF")
        print(f"qwen35 {kind} lazytrain fwd+recompute+bwd {ours['fwd_bwd_ms']:.2f} ms vs HF fwd+bwd (no recompute) "
              f"{hf['fwd_bwd_ms']:.2f} ms: {hf['fwd_bwd_ms'] / ours['fwd_bwd_ms']:.2f}x (the basis of runs <= 41)")
lin, full = r.get(("lazytrain", "linear_attention")), r.get(("lazytrain", "full_attention"))
if lin and full:
    print(f"qwen35 lazytrain linear/full layer time: (a) {lin['bwd_ms'] / full['bwd_ms']:.3f}, "
          f"(b) {lin['fwd_bwd_ms'] / full['fwd_bwd_ms']:.3f} (target <= 1.2)")
