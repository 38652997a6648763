#!/usr/bin/env python3
"""Checks the emulated 24 GB card run (scripts/gpu-test emu24) from metrics.jsonl files.

Usage: emu_check.py REF_DIR [RESUMED_DIR]. REF_DIR: the uninterrupted run. Per step: finite loss and gradient norm;
the last loss below the first; from the second step on (the first step's update runs beside the second), the
exposed optimizer at most 15 % of the step and the measured step within 10 % of the predicted one. RESUMED_DIR: the
run killed with -9 and resumed from its checkpoint; every step it logged after the resume has the reference's loss,
bit for bit. Prints a markdown table and the verdicts; exits 1 when a check fails."""
import math
import os
import sys

from smoke_check import steps  # the train records of a metrics.jsonl (a line cut by a kill is skipped)


def records(d):
    """The train records of d/metrics.jsonl by step (a resumed run logs the steps after its checkpoint again)."""
    out = {}
    for j in steps(os.path.join(d, "metrics.jsonl")):
        out.setdefault(j["step"], []).append(j)
    return out


def fnum(v):
    return float("nan") if v is None else float(v)


def main(argv):
    if not argv:
        sys.exit(__doc__)
    ref = records(argv[0])
    fails = []
    if not ref:
        fails.append(f"no train records in {argv[0]}")
    print("| step | loss | grad norm | step s (pred) | off | exposed optimizer | share |")
    print("|---|---|---|---|---|---|---|")
    for step in sorted(ref):
        j = ref[step][-1]
        loss, norm = fnum(j.get("loss")), fnum(j.get("grad_norm"))
        t, pred = j["step_time_s"], j["breakdown"]["predicted"]["step_s"]
        opt = j["exposed_optimizer_s"]
        off, share = t / pred - 1, opt / t
        print(f"| {step} | {loss:.4f} | {norm:.3f} | {t:.2f} ({pred:.2f}) | {off:+.1%} | {opt * 1e3:.0f} ms | {share:.1%} |")
        if not (math.isfinite(loss) and math.isfinite(norm)):
            fails.append(f"step {step}: loss {loss} or grad norm {norm} not finite")
        if step > 1 and abs(off) > 0.10:
            fails.append(f"step {step}: measured {t:.2f} s is {off:+.1%} off the predicted {pred:.2f} s")
        if step > 1 and share > 0.15:
            fails.append(f"step {step}: exposed optimizer {share:.1%} of the step")
    steps = sorted(ref)
    if len(steps) >= 2 and not fnum(ref[steps[-1]][-1]["loss"]) < fnum(ref[steps[0]][-1]["loss"]):
        fails.append("loss not falling (the last step's above the first's)")
    if len(argv) > 1:
        res = records(argv[1])
        compared = 0
        for step, js in sorted(res.items()):
            for j in js:
                if step in ref:
                    compared += 1
                    if j["loss"] != ref[step][-1]["loss"]:
                        fails.append(f"resumed step {step}: loss {j['loss']!r} against {ref[step][-1]['loss']!r}")
        print(f"\nresumed run: {compared} logged steps compared with the uninterrupted run's losses")
        if max(res, default=0) < max(steps, default=0):
            fails.append(f"the resumed run ended at step {max(res, default=0)}, not {max(steps, default=0)}")
    for f in fails:
        print("FAIL:", f)
    print("ok" if not fails else f"{len(fails)} check(s) failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
