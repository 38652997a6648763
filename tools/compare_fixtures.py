#!/usr/bin/env python3
"""Compare two HF-fixture trees made by tools/make_hf_fixtures.py (e.g. the committed one and one
regenerated on another machine): every tensor of every model, max abs and relative difference.
Exit 1 if any tensor differs by more than --rtol of its max magnitude (default 1e-5).
Usage: python3 tools/compare_fixtures.py tests/fixtures/hf /tmp/lt-hf"""
import argparse
import os
import sys

from safetensors.numpy import load_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rtol", type=float, default=1e-5)
    args = ap.parse_args()
    worst = 0.0
    bad = 0
    for name in sorted(os.listdir(args.a)):
        da = os.path.join(args.a, name)
        if not os.path.isdir(da):
            continue
        for f in ("model.safetensors", "fixture.safetensors"):
            ta = load_file(os.path.join(da, f))
            tb = load_file(os.path.join(args.b, name, f))
            if set(ta) != set(tb):
                print(f"{name}/{f}: tensor names differ: {sorted(set(ta) ^ set(tb))[:5]}")
                bad += 1
                continue
            m = 0.0
            for k in ta:
                x, y = ta[k].astype("float64"), tb[k].astype("float64")
                if x.shape != y.shape:
                    print(f"{name}/{f}:{k}: shape {x.shape} vs {y.shape}")
                    bad += 1
                    continue
                scale = max(abs(x).max(initial=0.0), 1e-30)
                r = float(abs(x - y).max(initial=0.0) / scale)
                m = max(m, r)
                if r > args.rtol:
                    print(f"{name}/{f}:{k}: max diff {r:.3e} of max magnitude")
                    bad += 1
            worst = max(worst, m)
            print(f"{name}/{f}: {len(ta)} tensors, worst relative max-diff {m:.3e}")
    print(f"compare_fixtures: worst {worst:.3e}, {bad} tensors over rtol {args.rtol}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
