#!/usr/bin/env python3
"""Single-thread encode throughput, lazytrain vs HF tokenizers, on the same corpus in one run.
Corpus: the fixture texts of tools/make_tokenizer_fixtures2.py (multilingual, code, emoji, numbers),
repeated with per-copy variations up to SIZE_MB. Tokenizer: a full (untrimmed) tokenizer.json, e.g.
$LT_TOKCACHE/full/llama3 made by tools/make_tokenizer_fixtures2.py.
Needs: pip install tokenizers (and what tools/make_tokenizer_fixtures2.py needs, for its corpus)
Usage: RAYON_NUM_THREADS=1 python3 bench/tokenizer_vs_hf.py TOKENIZER_DIR [SIZE_MB=100] [BUILD=build]
"""
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import make_tokenizer_fixtures2 as F  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

tok_dir = sys.argv[1]
size = int(float(sys.argv[2]) * 1e6) if len(sys.argv) > 2 else 100_000_000
build = sys.argv[3] if len(sys.argv) > 3 else "build"
corpus = f"/tmp/lt_tok_corpus_{size}.txt"
if not os.path.exists(corpus):
    rng = random.Random(1)
    base = [t.replace("\n", " ").replace("\r", " ") for t in F.CORPUS if t]
    with open(corpus, "w") as f:
        n = 0
        while n < size:
            line = " ".join(rng.choice(base) for _ in range(8)) + f" {rng.randint(0, 10**9)}"
            f.write(line + "\n")
            n += len(line.encode()) + 1
lines = open(corpus).read().split("\n")
lines = [l for l in lines if l]
nbytes = sum(len(l.encode()) for l in lines)
path = os.path.join(tok_dir, "tokenizer.json") if os.path.isdir(tok_dir) else tok_dir
hf = Tokenizer.from_file(path)
t0 = time.perf_counter()
ntok = 0
for l in lines:
    ntok += len(hf.encode(l, add_special_tokens=False).ids)
s = time.perf_counter() - t0
print(f"HF tokenizers: {nbytes} bytes, {ntok} tokens, {s:.2f} s, {nbytes / s / 1e6:.2f} MB/s (single thread)")
out = subprocess.run([os.path.join(build, "bench", "bench_tokenize_file"), tok_dir, corpus], capture_output=True, text=True)
print(out.stdout.strip() or out.stderr.strip())
