#!/usr/bin/env python3
"""Side-by-side loss curves of two or more `lazytrain train` runs (their metrics.jsonl), e.g. the fp32 and
bf16-sr master runs of scripts/gpu-test quality: per logged step each run's loss, the relative difference
to the first run, the mean over the last quarter, and each run's exact match when it was evaluated.

  tools/compare_loss_curves.py NAME=DIR/metrics.jsonl NAME=DIR/metrics.jsonl [--every N]
"""
import json
import sys


def read(path):
    losses, em = {}, None
    for line in open(path):
        try:
            j = json.loads(line)
        except json.JSONDecodeError:
            continue
        if j.get("type") == "train":
            losses[j["step"]] = j["loss"]
        elif j.get("type") == "exact_match":
            em = j["exact_match"]
    return losses, em


def main(argv):
    every = 1
    runs = []
    for a in argv:
        if a.startswith("--every="):
            every = int(a.split("=", 1)[1])
        else:
            name, path = a.split("=", 1)
            runs.append((name, *read(path)))
    if len(runs) < 2:
        sys.exit("need at least two NAME=metrics.jsonl")
    steps = sorted(set.intersection(*(set(r[1]) for r in runs)))
    print("step " + " ".join(f"{r[0]:>12}" for r in runs) + "   rel.diff vs " + runs[0][0])
    for i, s in enumerate(steps):
        if i % every and i != len(steps) - 1:
            continue
        base = runs[0][1][s]
        print(f"{s:>4} " + " ".join(f"{r[1][s]:>12.5f}" for r in runs) + "   " +
              " ".join(f"{(r[1][s] - base) / base:+.3%}" for r in runs[1:]))
    tail = steps[len(steps) * 3 // 4:]
    for name, losses, em in runs:
        mean = sum(losses[s] for s in tail) / max(1, len(tail))
        print(f"{name}: mean loss over the last quarter ({len(tail)} logged steps) {mean:.5f}; "
              f"exact match {'n/a' if em is None else f'{100 * em:.2f} %'}")


if __name__ == "__main__":
    main(sys.argv[1:])
