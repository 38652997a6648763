#!/usr/bin/env python3
"""flash-linear-attention's chunked Gated DeltaNet rule (fla-core, Triton) at the Qwen3.6-27B layer's shape beside
ours, on the GPU machine in one call (scripts/gpu-test fla):

- fla's `chunk_gated_delta_rule` forward and forward+backward (CUDA events, the median of --iters after warm-up),
  with q/k of --hk heads and v/g/beta of --hv heads (fla's grouped value heads, as the model has them);
- fla's numerics against an fp32 recurrence of the same rule (the model's definition: the state decays by exp(g),
  then takes beta (v - S^T k) k^T, and o = S^T q / sqrt(dk)) on the first sample, its output and the gradients of
  q, k, v, g and beta;
- ours from bench_deltanet's log (--ours): the default rule's forward and backward lines, and the ratio.

fla 0.6.0 refuses the gated backward on Hopper with Triton >= 3.4 and < 3.7.1 (it gave wrong results there, fla
issue 640); --bypass-guard lets it run so that its numerics are measured rather than assumed. Its wheels (fla-core,
einops: pure Python) come from scripts/fetch-fla into .deps/wheels (--wheels), since the GPU machine has no network.
Prints a markdown table; --json FILE writes the figures."""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile


def install_wheels(d):
    target = tempfile.mkdtemp(prefix="fla-site-")
    wheels = [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".whl")]
    if not wheels:
        sys.exit(f"bench_fla_gdn: no wheels in {d} (run scripts/fetch-fla here and carry .deps/wheels)")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", target,
                    *wheels], check=True)
    sys.path.insert(0, target)


def inputs(torch, a, batch, grad):
    g0 = torch.Generator(device="cuda").manual_seed(7)
    F = torch.nn.functional

    def rn(*shape):
        return torch.randn(*shape, device="cuda", generator=g0)
    q = F.normalize(rn(batch, a.seq, a.hk, a.dk), dim=-1)  # the model L2-normalises q and k per head
    k = F.normalize(rn(batch, a.seq, a.hk, a.dk), dim=-1)
    v = rn(batch, a.seq, a.hv, a.dv)
    g = F.logsigmoid(rn(batch, a.seq, a.hv) + 2.0)  # log decay in (-inf, 0), mostly near 0
    beta = torch.sigmoid(rn(batch, a.seq, a.hv))
    t = [x.to(torch.bfloat16).requires_grad_(grad) for x in (q, k, v, g, beta)]
    return t


def reference(torch, q, k, v, g, beta, scale):
    """fp32 recurrence over one sample: q, k [T, Hk, Dk], v [T, Hv, Dv], g, beta [T, Hv]."""
    T, Hk, Dk = q.shape
    Hv, Dv = v.shape[1], v.shape[2]
    rep = Hv // Hk
    q = q.repeat_interleave(rep, dim=1) * scale
    k = k.repeat_interleave(rep, dim=1)
    S = torch.zeros(Hv, Dk, Dv, device=q.device, dtype=torch.float32)
    outs = []
    for t in range(T):
        S = S * torch.exp(g[t])[:, None, None]
        pred = torch.einsum("hk,hkv->hv", k[t], S)
        S = S + (beta[t][:, None] * (v[t] - pred))[:, None, :] * k[t][:, :, None]
        outs.append(torch.einsum("hk,hkv->hv", q[t], S))
    return torch.stack(outs)


def rel(a, b):
    a, b = a.double(), b.double()
    d = (a - b).norm().item()
    r = b.norm().item()
    return float("inf") if not math.isfinite(d) else (d / r if r > 0 else d)


def numerics(torch, chunk_rule, a):
    q, k, v, g, beta = inputs(torch, a, 1, True)
    scale = 1.0 / math.sqrt(a.dk)
    o, _ = chunk_rule(q, k, v, g, beta, scale=scale)
    do = torch.randn_like(o, dtype=torch.float32).to(o.dtype)
    o.backward(do)
    got = [o] + [x.grad for x in (q, k, v, g, beta)]
    leaves = [x.detach().float()[0].requires_grad_(True) for x in (q, k, v, g, beta)]
    ref_o = reference(torch, *leaves, scale)
    ref_o.backward(do.float()[0])
    want = [ref_o] + [x.grad for x in leaves]
    names = ["o", "dq", "dk", "dv", "dg", "dbeta"]
    return {n: rel(x.float()[0], w) for n, x, w in zip(names, got, want)}


def ours_from_log(path):
    """The default rule's forward and backward (ms) from bench_deltanet's table."""
    fwd = bwd = None
    with open(path) as f:
        for line in f:
            m = re.match(r"\s+rule_(fwd|bwd) \[(\S+)\]\s+([0-9.]+) ms", line)
            if m:
                if m.group(1) == "fwd":
                    fwd = float(m.group(3))
                else:
                    bwd = float(m.group(3))
    return fwd, bwd


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheels", help="folder of the fla-core and einops wheels (scripts/fetch-fla)")
    ap.add_argument("--ours", help="bench_deltanet's log of the same call")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--hk", type=int, default=16)
    ap.add_argument("--hv", type=int, default=48)
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--bypass-guard", action="store_true", help="run fla's gated backward where it refuses Hopper")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    if a.wheels:
        install_wheels(a.wheels)
    import torch
    import triton
    import fla
    import fla.ops.common.chunk_o as chunk_o
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    guard = bool(getattr(chunk_o, "IS_NVIDIA_HOPPER", False) and getattr(chunk_o, "TRITON_ABOVE_3_4_0", False)
                 and not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True))
    if guard and a.bypass_guard:
        chunk_o.TRITON_ABOVE_3_7_1 = True
    res = {"fla": getattr(fla, "__version__", "?"), "triton": triton.__version__, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(), "guard_bypassed": guard and a.bypass_guard,
           "shape": dict(batch=a.batch, seq=a.seq, hk=a.hk, hv=a.hv, dk=a.dk, dv=a.dv)}
    scale = 1.0 / math.sqrt(a.dk)
    q, k, v, g, beta = inputs(torch, a, a.batch, False)
    from bench_torch_kernels import median_time  # seconds, CUDA events after warm-up
    res["fla_fwd_ms"] = 1e3 * median_time(lambda: chunk_gated_delta_rule(q, k, v, g, beta, scale=scale), reps=a.iters)
    qg, kg, vg, gg, bg = inputs(torch, a, a.batch, True)
    do = torch.randn(a.batch, a.seq, a.hv, a.dv, device="cuda", dtype=torch.bfloat16)

    def fwd_bwd():
        o, _ = chunk_gated_delta_rule(qg, kg, vg, gg, bg, scale=scale)
        o.backward(do)
    res["fla_fwd_bwd_ms"] = 1e3 * median_time(fwd_bwd, reps=a.iters)
    res["fla_rel_err"] = numerics(torch, chunk_gated_delta_rule, a)
    if a.ours:
        f, b = ours_from_log(a.ours)
        res["ours_fwd_ms"], res["ours_bwd_ms"] = f, b
        if f is not None and b is not None:
            res["ours_fwd_bwd_ms"] = f + b
            res["ours_over_fla"] = (f + b) / res["fla_fwd_bwd_ms"]
    shape = f"batch {a.batch} x {a.seq}, {a.hk} key / {a.hv} value heads of {a.dk}/{a.dv}"
    print(f"Gated DeltaNet rule, {shape}, on {res['gpu']} (fla {res['fla']}, triton {res['triton']}"
          f"{', guard bypassed' if res['guard_bypassed'] else ''})")
    print("| implementation | fwd ms | fwd+bwd ms | vs fla |")
    print("|---|---|---|---|")
    print(f"| fla chunk_gated_delta_rule | {res['fla_fwd_ms']:.3f} | {res['fla_fwd_bwd_ms']:.3f} | 1.00 |")
    if res.get("ours_fwd_bwd_ms"):
        print(f"| ours (bench_deltanet's default rule) | {res['ours_fwd_ms']:.3f} | {res['ours_fwd_bwd_ms']:.3f} | "
              f"{res['ours_over_fla']:.2f} |")
    print("fla against the fp32 recurrence (first sample), relative L2: " +
          ", ".join(f"{n} {e:.2e}" for n, e in res["fla_rel_err"].items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
