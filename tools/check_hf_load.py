#!/usr/bin/env python3
"""Check that model directories written by lazytrain load in HF transformers unchanged.

For each tiny preset (or each --dir given) this:
  1. asks lazytrain to write a seeded random-init model twice: bf16 and sharded (small --max-shard, so the
     index file is exercised), and fp32 in one file (the reference values):
       lazytrain model-info --model P --write-random DIR --seed S --save-dtype bf16|fp32 [--max-shard 64KiB]
  2. loads each directory with AutoModelForCausalLM.from_pretrained (fp32), requiring no missing,
     unexpected or mismatched keys and the architecture/shape lazytrain wrote;
  3. compares every parameter of the loaded model with the fp32 reference read straight from the
     safetensors file (bit-exact for the fp32 dir; for the bf16 dir, equal to the reference rounded
     to bf16 by torch), checks tied models share the embedding, the parameter count equals the one
     `lazytrain model-info` prints, and that a forward pass gives finite logits.
Exit status 0 only if every check passes. Usage (CPU or GPU machine, torch + transformers needed):
  /opt/refenv/bin/python tools/check_hf_load.py [--lazytrain build/bin/lazytrain] [--presets tiny-qwen2 ...]
  /opt/refenv/bin/python tools/check_hf_load.py --dir some/model_dir     # just load-check a directory
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM


def read_all(d):
    """All tensors of a model dir, read with the safetensors library (not transformers)."""
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(d, f), framework="pt") as s:
                for k in s.keys():
                    out[k] = s.get_tensor(k)
    return out


def load_hf(d):
    model, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise AssertionError(f"{d}: loading info not clean: {problems}")
    return model.eval()


def check_config(d, cfg):
    """transformers reads back the values lazytrain wrote (RoPE included, whichever spelling it uses)."""
    with open(os.path.join(d, "config.json")) as f:
        ours = json.load(f)
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
              "vocab_size", "rms_norm_eps", "tie_word_embeddings", "head_dim"):
        got = getattr(cfg, k, None)
        if k == "head_dim" and got is None:
            got = cfg.hidden_size // cfg.num_attention_heads
        if k in ours and got != ours[k]:
            raise AssertionError(f"{d}: config {k}: wrote {ours[k]}, transformers reads {got}")
    rp = getattr(cfg, "rope_parameters", None) or {}
    want = ours["rope_parameters"]
    for k, v in want.items():
        if rp.get(k) != v:
            raise AssertionError(f"{d}: rope_parameters[{k}]: wrote {v}, transformers reads {rp.get(k)}")


def check_dir(d, ref=None, ref_bf16=False, expect_count=None):
    cfg = AutoConfig.from_pretrained(d)
    check_config(d, cfg)
    model = load_hf(d)
    sd = model.state_dict()
    files = read_all(d)
    n_params = sum(p.numel() for p in model.parameters())  # tied counted once
    if expect_count is not None and n_params != expect_count:
        raise AssertionError(f"{d}: transformers counts {n_params} parameters, lazytrain says {expect_count}")
    if cfg.tie_word_embeddings:
        if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            raise AssertionError(f"{d}: tied config but lm_head is not the embedding")
    for name, t in sd.items():
        src = name
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            src = "model.embed_tokens.weight"
        if src not in files:
            raise AssertionError(f"{d}: {name} not in the safetensors files")
        if not torch.equal(t, files[src].to(torch.float32)):
            raise AssertionError(f"{d}: {name} differs from the file")
        if ref is not None:
            r = ref[src]
            if ref_bf16:
                r = r.to(torch.bfloat16)
            r = r.to(torch.float32)
            if not torch.equal(t, r):
                diff = (t - r).abs().max().item()
                raise AssertionError(f"{d}: {name} differs from lazytrain's fp32 values (max abs diff {diff:g})")
    ids = torch.arange(12).remainder(cfg.vocab_size).reshape(2, 6)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    if not torch.isfinite(logits).all():
        raise AssertionError(f"{d}: non-finite logits")
    return cfg, n_params, len(sd)


def lazytrain_count(exe, preset):
    out = subprocess.run([exe, "model-info", "--model", preset], check=True, capture_output=True, text=True).stdout
    m = re.search(r"^parameters\s+([\d,]+) total", out, re.M)
    if not m:
        raise AssertionError(f"cannot find the parameter count in lazytrain model-info output:\n{out}")
    return int(m.group(1).replace(",", ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lazytrain", default="build/bin/lazytrain")
    ap.add_argument("--presets", nargs="*", default=["tiny-qwen2", "tiny-qwen3", "tiny-llama3"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", action="append", default=[], help="only load-check these directories")
    ap.add_argument("--keep", help="write the model dirs here instead of a temporary directory")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    failures = 0
    if a.dir:
        for d in a.dir:
            try:
                cfg, n, k = check_dir(d)
                print(f"OK   {d}: {cfg.architectures[0]}, {n} parameters, {k} tensors")
            except Exception as e:  # noqa: BLE001 - report every failure, then exit non-zero
                print(f"FAIL {d}: {e}")
                failures += 1
        return 1 if failures else 0
    root = a.keep or tempfile.mkdtemp(prefix="lt_hfload_")
    for p in a.presets:
        try:
            d32, d16 = os.path.join(root, p + "-fp32"), os.path.join(root, p + "-bf16")
            run = lambda *args: subprocess.run([a.lazytrain, "model-info", "--model", p, "--seed", str(a.seed), *args],
                                               check=True, capture_output=True, text=True)
            run("--write-random", d32, "--save-dtype", "fp32")
            run("--write-random", d16, "--save-dtype", "bf16", "--max-shard", "64KiB")
            count = lazytrain_count(a.lazytrain, p)
            ref = read_all(d32)
            cfg, n, k = check_dir(d32, ref, False, count)
            shards = [f for f in os.listdir(d16) if f.endswith(".safetensors")]
            check_dir(d16, ref, True, count)
            print(f"OK   {p}: {cfg.architectures[0]}, {n} parameters, {k} tensors; fp32 bit-exact, "
                  f"bf16 ({len(shards)} shards) = bf16(fp32)")
        except Exception as e:  # noqa: BLE001
            print(f"FAIL {p}: {e}")
            failures += 1
    print("all checks passed" if not failures else f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
