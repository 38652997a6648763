#!/usr/bin/env python3
"""Learnability check of the builtin math formats (docs/data.md): trains a 0.83M-parameter Qwen2-shaped
model (hidden 128, 4 layers, ffn 384, vocab 306 = configs/demo tokenizer) with PyTorch on CPU on a+b
problems (a, b in 0..199) written as src/data/synth_math.cpp writes them, and reports greedy exact match on
150 problems never seen in training. Reference experiment only (lazytrain itself needs no Python).
Needs: pip install torch tokenizers transformers (CPU torch is enough)
Run: python3 tools/math_learnability.py steps|direct N_STEPS
"""
import math, os, random, sys, time
import torch
from tokenizers import Tokenizer
from transformers import Qwen2Config, Qwen2ForCausalLM
torch.set_num_threads(1); torch.manual_seed(0)
style = sys.argv[1]; steps_n = int(sys.argv[2])
tok = Tokenizer.from_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'configs', 'demo', 'tokenizer.json'))
def steps(a, b):
    da, db = [int(c) for c in reversed(str(a))], [int(c) for c in reversed(str(b))]
    parts, c = [], 0
    for i in range(max(len(da), len(db))):
        x = da[i] if i < len(da) else 0; y = db[i] if i < len(db) else 0
        s = x + y + c; parts.append(f"{x}+{y}+{c}={s}"); c = s // 10
    return ", ".join(parts)
def resp(a, b):
    r = a + b
    return (f"{steps(a,b)}. The answer is: {r}" if style == 'steps' else f"{a} + {b} = {r}. The answer is: {r}")
rng = random.Random(0)
allp = [(a, b) for a in range(200) for b in range(200)]; rng.shuffle(allp)
test, train = allp[:400], allp[400:]
def enc(a, b, with_resp=True):
    p = f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n"
    pid = tok.encode(p).ids
    if not with_resp: return pid
    rid = tok.encode(resp(a, b) + "<|im_end|>").ids
    return pid, rid
cfg = Qwen2Config(vocab_size=306, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)
model = Qwen2ForCausalLM(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
B, S = 32, 64
def batch():
    ids = torch.full((B, S), 303); lab = torch.full((B, S), -100)
    for i in range(B):
        a, b = train[rng.randrange(len(train))]
        p, r = enc(a, b); x = p + r
        ids[i, :len(x)] = torch.tensor(x); lab[i, len(p):len(x)] = torch.tensor(r)
    return ids, lab
def evaluate(n=150):
    model.eval(); ok = 0
    with torch.no_grad():
        for a, b in test[:n]:
            x = torch.tensor([enc(a, b, False)])
            out = model.generate(x, max_new_tokens=40, do_sample=False, eos_token_id=305, pad_token_id=303)
            txt = tok.decode(out[0, x.shape[1]:].tolist(), skip_special_tokens=True)
            ok += txt.split("The answer is: ")[-1].strip() == str(a + b)
    model.train(); return ok / n
t0 = time.time()
for step in range(1, steps_n + 1):
    lr = 3e-3 * min(1, step / 30) * 0.5 * (1 + math.cos(math.pi * step / steps_n))
    for g in opt.param_groups: g['lr'] = lr
    ids, lab = batch()
    loss = model(input_ids=ids, labels=lab).loss
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()
    if step % 100 == 0: print(style, step, round(loss.item(), 4), round(time.time() - t0, 1), 's', flush=True)
    if step % 400 == 0 or step == steps_n: print(style, 'step', step, 'EM', evaluate(), flush=True)
