#!/usr/bin/env python3
"""Make HF-transformers parity fixtures for lazytrain's CPU reference (tests/ops).

For each small random model (fp32, eager attention) this runs one forward+backward on a fixed batch and
writes <out>/<name>/:
  config.json          the HF config (loads with transformers unchanged)
  model.safetensors    the weights under HF names (tied models omit lm_head.weight, like save_pretrained)
  fixture.safetensors  input_ids [B,S] (I64), labels [B,S] (I64, -100 = ignored), logits [B,S,V] (F32),
                       loss [] (F32; HF's own: mean over non-ignored shifted labels),
                       grad.<hf name> for every parameter (F32; tied: the embedding's grad includes the head's)
The long-row fixture (qwen2_long_row: one row of LONG_S tokens, SDPA attention, which on the CPU does not hold the
S x S scores) keeps the logits of a few rows only: logits.rows [R] (I64, flat token indices), logits.at [R,V].
Its provenance goes to PROVENANCE_long_row.json.
Deterministic (fixed seeds, CPU, deterministic algorithms). Usage:
  /opt/refenv/bin/python tools/make_hf_fixtures.py [--out tests/fixtures/hf] [--device cpu]
"""
import argparse
import json
import os
import shutil

# Deterministic cuBLAS (needed by torch.use_deterministic_algorithms on CUDA); set before torch loads.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

VOCAB = 300
B, S = 2, 17
LONG_S = 16384
LONG = "qwen2_long_row"


def common(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                initializer_range=0.02, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    base.update(kw)
    return base


def models():
    # Qwen2: q/k/v bias, tied embeddings.
    yield "qwen2_bias_tied", Qwen2Config(**common(tie_word_embeddings=True, rms_norm_eps=1e-6,
                                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    # Qwen3: QK-norm, explicit head_dim != hidden/heads, untied.
    yield "qwen3_qknorm_untied", Qwen3Config(**common(head_dim=32, tie_word_embeddings=False, rms_norm_eps=1e-6,
                                                       rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    # Llama-3.1 style: llama3 rope scaling whose bands straddle the head's wavelengths, untied.
    llama3_rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    yield "llama3_rope_untied", LlamaConfig(**common(tie_word_embeddings=False, rms_norm_eps=1e-5,
                                                      rope_parameters=dict(llama3_rope)))
    # Llama-3.2 style: tied, llama3 rope, multi-query (one kv head), head_dim 8.
    yield "llama32_mqa_tied", LlamaConfig(**common(num_attention_heads=8, num_key_value_heads=1, tie_word_embeddings=True,
                                                    rms_norm_eps=1e-5, rope_parameters=dict(llama3_rope)))
    # One long row: Qwen2 with bias, untied, positions up to LONG_S.
    yield LONG, Qwen2Config(**common(tie_word_embeddings=False, rms_norm_eps=1e-6, max_position_embeddings=LONG_S,
                                     rope_parameters={"rope_type": "default", "rope_theta": 1e6}))


def randomize(model, gen):
    # HF init leaves norms at 1 and biases at 0; perturb them so their gradients and effects are tested.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))


def batch(gen):
    ids = torch.randint(3, VOCAB, (B, S), generator=gen)
    labels = ids.clone()
    labels[0, :4] = -100                       # a masked prompt
    labels[1, 5] = -100                        # scattered ignored labels
    labels[1, 11] = -100
    labels[1, S - 2] = -100
    return ids, labels


def long_batch(gen):
    ids = torch.randint(3, VOCAB, (1, LONG_S), generator=gen)
    labels = ids.clone()
    labels[0, :200] = -100                     # a masked prompt
    labels[0, 5000:5010] = -100                # ignored labels far into the row
    labels[0, LONG_S - 2] = -100
    return ids, labels


def logits_entries(name, logits):
    if name != LONG:
        return {"logits": logits.contiguous()}
    flat = logits.reshape(-1, logits.shape[-1])
    rows = torch.tensor([0, 1, 2, 199, 200, 4999, 5010, 8191, 12000, LONG_S - 3, LONG_S - 2, LONG_S - 1])
    return {"logits.rows": rows, "logits.at": flat[rows].contiguous()}


def make_one(name, cfg, out_dir, device):
    gen = torch.Generator().manual_seed(1234)
    torch.manual_seed(1234)
    attn = "sdpa" if name == LONG else "eager"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    randomize(model, gen)
    model.to(device).train()
    for m in model.modules():  # no dropout in these configs, but be explicit
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    ids, labels = long_batch(gen) if name == LONG else batch(gen)
    outp = model(input_ids=ids.to(device), labels=labels.to(device))
    outp.loss.backward()

    d = os.path.join(out_dir, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    model.save_pretrained(d, safe_serialization=True)
    for extra in os.listdir(d):
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(d, extra))
    fx = {"input_ids": ids.contiguous(), "labels": labels.contiguous(),
          **logits_entries(name, outp.logits.detach().float().cpu()),
          "loss": outp.loss.detach().float().cpu().reshape(())}
    for pname, p in model.named_parameters():
        fx["grad." + pname] = p.grad.detach().float().cpu().contiguous()
    # No metadata: safetensors writes its dict in hash order, which would make the bytes vary between
    # runs. Provenance goes to PROVENANCE.json instead.
    save_file(fx, os.path.join(d, "fixture.safetensors"))
    print(f"{name}: loss={outp.loss.item():.6f} params={sum(p.numel() for p in model.parameters())} -> {d}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "hf")))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", default=None, help="comma-separated model names")
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    # True fp32 on GPUs too (no TF32 in matmuls or convolutions).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    os.makedirs(a.out, exist_ok=True)
    only = set(a.only.split(",")) if a.only else None
    made = set()
    for name, cfg in models():
        if only and name not in only:
            continue
        make_one(name, cfg, a.out, torch.device(a.device))
        made.add(name)
    for fname, batch_seq, names in (("PROVENANCE.json", (B, S), made - {LONG}),
                                    ("PROVENANCE_long_row.json", (1, LONG_S), made & {LONG})):
        if not names:
            continue
        with open(os.path.join(a.out, fname), "w") as f:
            json.dump({"script": "tools/make_hf_fixtures.py", "torch": torch.__version__,
                       "transformers": transformers.__version__, "device": a.device, "batch": batch_seq[0],
                       "seq": batch_seq[1]}, f, indent=1, sort_keys=True)
            f.write("\n")


if __name__ == "__main__":
    main()
