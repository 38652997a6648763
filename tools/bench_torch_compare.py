#!/usr/bin/env python3
"""Sets lazytrain's kernel timings against PyTorch's (JSON lines from bench_cuda_kernels and
bench_torch_kernels.py of the same run): speed ratio = torch time / lazytrain time, with the targets
(GEMM >= 0.95, decoder layer fwd+bwd >= 1.2, attention fwd+bwd >= 1.2x SDPA flash).
Our attention rows: attn_* the layers' path (cuDNN's flash attention where usable), attn_own_* our kernels,
attn_atomic_* cuDNN with its non-deterministic backward; each is set against torch's attn_* row."""
import json
import sys

TARGETS = {"gemm": 0.95, "attn_fwdbwd": 1.2, "layer_fwdbwd": 1.2}
VARIANTS = ("attn_own_", "attn_atomic_")


def main(ours_path, torch_path):
    def load(p):
        d = {}
        for line in open(p):
            line = line.strip()
            if line:
                r = json.loads(line)
                d[(r["kind"], r["name"])] = r
        return d
    ours, ref = load(ours_path), load(torch_path)
    print(f"{'kind':12s} {'shape':40s} {'ours ms':>9s} {'torch ms':>9s} {'ours TF':>8s} {'speed':>6s} target")
    for key in sorted(ours):
        base = key[0]
        for v in VARIANTS:
            if base.startswith(v):
                base = "attn_" + base[len(v):]
        if (base, key[1]) not in ref:
            continue
        o, t = ours[key], ref[(base, key[1])]
        ratio = t["seconds"] / o["seconds"]
        tgt = TARGETS.get(key[0])
        mark = "" if tgt is None else (f">={tgt} {'ok' if ratio >= tgt else 'MISS'}")
        print(f"{key[0]:12s} {key[1]:40s} {o['seconds']*1e3:9.3f} {t['seconds']*1e3:9.3f} {o['tflops']:8.1f} "
              f"{ratio:6.2f} {mark}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
