#!/usr/bin/env python3
"""Sets lazytrain's kernel timings against PyTorch's (JSON lines from bench_cuda_kernels and
bench_torch_kernels.py of the same run): speed ratio = torch time / lazytrain time, with the targets
of issue 5 (GEMM >= 0.95, attention fwd+bwd >= 0.8, decoder layer fwd+bwd >= 1.2)."""
import json
import sys

TARGETS = {"gemm": 0.95, "attn_fwdbwd": 0.8, "layer_fwdbwd": 1.2}


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
        if key not in ref:
            continue
        o, t = ours[key], ref[key]
        ratio = t["seconds"] / o["seconds"]
        tgt = TARGETS.get(key[0])
        mark = "" if tgt is None else (f">={tgt} {'ok' if ratio >= tgt else 'MISS'}")
        print(f"{key[0]:12s} {key[1]:40s} {o['seconds']*1e3:9.3f} {t['seconds']*1e3:9.3f} {o['tflops']:8.1f} "
              f"{ratio:6.2f} {mark}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
