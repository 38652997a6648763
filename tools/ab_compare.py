#!/usr/bin/env python3
"""Compares training logs of one line run by two builds in one call (scripts/gpu-test ab).

Usage: ab_compare.py NAME=LOG [NAME=LOG ...]. Reads each log's `step i/n | ... | loss L | grad_norm G | ... |
T tok/s ... | F TFLOPS` lines and prints a markdown table: TFLOPS per step, the median, tokens/s (median), losses,
and each run's median TFLOPS as a ratio to the first run's. Exits 1 when a log has no step line."""
import re
import statistics
import sys

STEP = re.compile(r"^step (\d+)/\d+ \|.*?\| loss (\S+) \| grad_norm (\S+) \|.*?\| ([\d.]+) tok/s .*?\| ([\d.]+) TFLOPS")


def read(path):
    steps = []
    with open(path, errors="replace") as f:
        for line in f:
            m = STEP.match(line)
            if m:
                steps.append({"loss": m.group(2), "norm": m.group(3), "tok": float(m.group(4)),
                              "tflops": float(m.group(5))})
    return steps


def main(argv):
    runs = []
    for arg in argv:
        name, _, path = arg.partition("=")
        if not path:
            sys.exit(f"ab_compare: '{arg}' is not NAME=LOG")
        runs.append((name, read(path)))
    print("| run | TFLOPS per step | median | tokens/s (median) | loss per step | grad norm per step | vs first |")
    print("|---|---|---|---|---|---|---|")
    first = None
    ok = True
    for name, steps in runs:
        if not steps:
            print(f"| {name} | no step line | | | | | |")
            ok = False
            continue
        med = statistics.median(s["tflops"] for s in steps)
        first = first or med
        tflops = " / ".join("%.1f" % s["tflops"] for s in steps)
        tok = statistics.median(s["tok"] for s in steps)
        losses = " / ".join(s["loss"] for s in steps)
        norms = " / ".join(s["norm"] for s in steps)
        print(f"| {name} | {tflops} | {med:.1f} | {tok:.0f} | {losses} | {norms} | {med / first:.4f} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
