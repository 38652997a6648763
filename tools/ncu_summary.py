#!/usr/bin/env python3
"""Summarises an Nsight Compute CSV (`ncu --metrics gpu__time_duration.sum --csv PROGRAM > F.csv`): total time and
launch count per kernel (name without template arguments and parameters), largest first, with each kernel's share.
Used for the per-kernel split of bench_qwen35_layer (scripts/gpu-test gdnprof).
Usage: ncu_summary.py F.csv [--top N] [--divide K]   (--divide: report per call of the profiled loop, e.g. 3 when
the program ran fwd, bwd and fwd+bwd once each, i.e. twice the fwd+bwd work: use 2)"""
import argparse
import csv
import collections
import io
import lzma
import re


def short(name):
    # strip the parameter list, then template arguments, then namespaces
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    s = "".join(out).strip()
    s = re.sub(r"^void\s+", "", s)
    return s.split("::")[-1] or name[:60]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--divide", type=float, default=1.0)
    a = ap.parse_args()
    raw = (lzma.open(a.csv, "rt") if a.csv.endswith(".xz") else open(a.csv, newline="")).read()
    start = raw.find('"ID"')
    if start < 0:
        raise SystemExit(f"{a.csv}: no ncu CSV header (\"ID\", ...) found")
    rows = csv.DictReader(io.StringIO(raw[start:]))
    tot, cnt = collections.defaultdict(float), collections.Counter()
    unit_scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "ns": 1e-6, "us": 1e-3, "ms": 1.0}
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        ms = v * unit_scale.get(r.get("Metric Unit", "nsecond"), 1e-6)
        k = short(r["Kernel Name"])
        tot[k] += ms
        cnt[k] += 1
    total = sum(tot.values())
    d = a.divide
    print(f"{'kernel':60s} {'ms':>9s} {'calls':>6s} {'share':>6s}")
    for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{k[:60]:60s} {v / d:9.3f} {cnt[k] / d:6.1f} {100 * v / total:5.1f}%")
    print(f"{'total':60s} {total / d:9.3f} {sum(cnt.values()) / d:6.1f}")


if __name__ == "__main__":
    main()
