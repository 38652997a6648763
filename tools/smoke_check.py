#!/usr/bin/env python3
"""Checks the GPU smoke matrix (scripts/gpu-test smoke): for every row, the run's metrics.jsonl under
<dir>/<row>/ and, where present, the same steps with our own attention kernels under <dir>/<row>-own/.
Per row: every loss and gradient norm finite, no skipped step, the last loss below the first, and the two
runs' losses within 1e-2 and gradient norms within 5e-2 (relative; bf16 activations). A row with a twin (TWINS: the
same run another way that should give the same numbers up to GEMM rounding) is compared with it: losses within 1e-3,
norms within 1e-2. Prints a table (markdown) and exits 1 when a row fails."""
import json
import math
import os
import sys


def steps(path):
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if j.get("type") == "train":
                rows.append(j)
    return rows


def num(v):
    return float("nan") if v is None else float(v)  # JSON null: a non-finite value


# row -> the row it must agree with: the LM head's gradient by vocabulary slices against the full fp32 buffers.
TWINS = {"27b-headslices": "27b-devgrad-bf16"}


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def check(d, row):
    run = steps(os.path.join(d, row, "metrics.jsonl"))
    own = steps(os.path.join(d, row + "-own", "metrics.jsonl"))
    why = []
    if len(run) < 3:
        why.append(f"{len(run)} steps logged")
    losses = [num(s["loss"]) for s in run]
    norms = [num(s["grad_norm"]) for s in run]
    if any(not math.isfinite(x) for x in losses + norms):
        why.append("non-finite loss or norm")
    if any(s.get("update_skipped") for s in run):
        why.append("skipped steps")
    if len(losses) >= 2 and not losses[-1] < losses[0]:
        why.append("loss not falling")
    dl = dn = None
    if own:
        if len(own) != len(run):
            why.append(f"own kernels: {len(own)} steps")
        else:
            dl = max(rel(num(a["loss"]), num(b["loss"])) for a, b in zip(run, own))
            dn = max(rel(num(a["grad_norm"]), num(b["grad_norm"])) for a, b in zip(run, own))
            if not dl <= 1e-2:
                why.append(f"loss vs own kernels {dl:.2e}")
            if not dn <= 5e-2:
                why.append(f"norm vs own kernels {dn:.2e}")
    twin = steps(os.path.join(d, TWINS[row], "metrics.jsonl")) if row in TWINS else []
    if twin:
        tl = max(rel(num(a["loss"]), num(b["loss"])) for a, b in zip(run, twin))
        tn = max(rel(num(a["grad_norm"]), num(b["grad_norm"])) for a, b in zip(run, twin))
        if len(twin) != len(run) or not tl <= 1e-3 or not tn <= 1e-2:
            why.append(f"vs {TWINS[row]}: {len(twin)} steps, loss {tl:.2e}, norm {tn:.2e}")
    tfl = max((s.get("tflops", 0) for s in run), default=0)
    fmt = lambda v: "-" if v is None else f"{v:.1e}"
    print(f"| {row} | {' / '.join(f'{x:.3f}' for x in losses)} | {' / '.join(f'{x:.2f}' for x in norms)} | "
          f"{fmt(dl)} | {fmt(dn)} | {tfl:.0f} | {'ok' if not why else 'FAIL: ' + '; '.join(why)} |")
    return not why


def main():
    d = sys.argv[1]
    rows = sys.argv[2:]
    print("| row | loss (steps 1-3) | grad norm | loss vs own | norm vs own | TFLOPS | result |")
    print("|---|---|---|---|---|---|---|")
    ok = all([check(d, r) for r in rows])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
