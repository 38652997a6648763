#!/usr/bin/env python3
"""Make HF-transformers parity fixtures for lazytrain's Qwen3.5/3.6 (hybrid) CPU reference.

Small random Qwen3_5ForCausalLM models (fp32, eager attention, HF's PyTorch fallbacks of the gated
delta rule and the causal conv, which are the reference), one forward+backward each on a fixed batch
of 2 x 80 tokens (two delta-rule chunks of 64, the second padded), written like tools/make_hf_fixtures.py:
  <out>/<name>/config.json, model.safetensors, fixture.safetensors with input_ids, labels, logits, loss,
  grad.<hf name> for every parameter, and gen.prompt / gen.tokens: HF greedy generate() (cache on) of
  12 new tokens from a 10-token prompt.
Plus:
  qwen35_tied_3to1/packed.safetensors: one row packing two samples (30 + 50 tokens):
      packed.input_ids [1, 80], packed.positions [80] (restarting at the second sample),
      packed.separate_logits [80, V]: each sample run alone (what no leaking across samples gives),
      packed.hf_logits [80, V]: HF run on the packed row with restarting position_ids (HF's torch path
      ignores packing in the delta rule and the conv, so the second sample sees the first).
  qwen35_composite/: Qwen3_5ForConditionalGeneration (tiny vision tower) whose text decoder has the
      weights of qwen35_tied_3to1 rounded to bf16, saved in bf16, plus two fake mtp.* tensors (real
      checkpoints carry an MTP layer that transformers ignores); fixture.safetensors: input_ids, labels,
      loss, logits of the text model in fp32 on those weights.
  qwen35_bf16_*: the features of the small ones at hidden 256, with bf16-representable weights, for the
      GPU's bf16 step (HybridHfStepBf16; the small ones are too small for bf16 activations: docs/notes.md 0b).
Usage (GPU machine or any machine with torch + transformers >= 5.2):
  python3 tools/make_hf_fixtures_qwen35.py [--out tests/fixtures/hf] [--only NAME[,NAME]]
--only makes just those fixtures (packed and composite come with qwen35_tied_3to1) and records their
versions under "fixtures" in PROVENANCE_qwen35.json, leaving the others as they are.
"""
import argparse
import json
import math
import os
import shutil
import sys
from dataclasses import dataclass

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from transformers.models.qwen3_5 import Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig

VOCAB = 300
B, S = 2, 80


def text_config(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                head_dim=32, max_position_embeddings=512, initializer_range=0.02, rms_norm_eps=1e-6,
                bos_token_id=1, eos_token_id=2, pad_token_id=0,
                linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=24,
                linear_num_key_heads=2, linear_num_value_heads=4)
    base.update(kw)
    return base


def rope(theta, head_dim, frac=0.25):
    half = int(head_dim * frac) // 2
    sec = [half - 2 * (half // 4), half // 4, half // 4]
    return {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": frac, "mrope_section": sec,
            "mrope_interleaved": True}


@dataclass
class Init:
    bf16: bool = False  # round every weight to a bf16 value (kept in fp32)
    matrix_gain: float = 0.0  # matrices ~ N(0, gain^2 / fan_in); 0: N(0, 0.08^2), the small fixtures' draw


# Matrix gain of the bf16 fixtures: the fixed 0.08 makes a 256-wide model chaotic (bf16 rounding then moves
# its gradients to cosine 0.4-0.97 against fp32). With 0.3 / sqrt(fan_in) and the head shapes below, CPU
# simulations of the bf16 step (outputs and gradients of every module rounded to bf16; bf16 autocast; all
# bf16) keep every gradient's cosine >= 0.997 for this seed and three others; 3 value heads (A_log, dt_bias
# of 3 values) fell to 0.98.
BF16_MATRIX_GAIN = 0.3


def models(bf16_weights):
    small = Init(bf16=bf16_weights)
    # 3 linear : 1 full (the family's pattern, via full_attention_interval), tied, 4 value heads on 2 key heads,
    # key head dim 16 != value head dim 24.
    yield "qwen35_tied_3to1", text_config(num_hidden_layers=4, tie_word_embeddings=True,
                                          rope_parameters=rope(1e6, 32)), small
    # Odd head counts (3 q heads on 1 kv head; 3 value heads on 1 key head), head dims 64, untied, a
    # layer_types list that is not 3:1.
    yield "qwen35_untied_odd", text_config(
        hidden_size=48, num_hidden_layers=5, num_attention_heads=3, num_key_value_heads=1, head_dim=64,
        linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=64, linear_value_head_dim=64,
        layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention", "linear_attention"],
        tie_word_embeddings=False, rope_parameters=rope(1e7, 64)), small
    # Head dims 128 everywhere, conv kernel 3, untied.
    yield "qwen35_hd128", text_config(
        num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=128, linear_num_key_heads=1,
        linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=3,
        layer_types=["linear_attention", "full_attention", "linear_attention"], tie_word_embeddings=False,
        rope_parameters=rope(1e7, 128)), small
    yield from bf16_models()


def bf16_models():
    big = Init(bf16=True, matrix_gain=BF16_MATRIX_GAIN)
    # qwen35_tied_3to1 at hidden 256: 3:1, tied, 8 value heads on 2 key heads, key head dim 64 != value 16.
    yield "qwen35_bf16_tied_3to1", text_config(
        hidden_size=256, intermediate_size=128, num_hidden_layers=4, head_dim=64, linear_num_key_heads=2,
        linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=16, tie_word_embeddings=True,
        rope_parameters=rope(1e6, 64)), big
    # qwen35_untied_odd at hidden 256: 3 q heads on 1 kv head, 9 value heads on 3 key heads, key head dim
    # 32 != value 24, untied, not 3:1 (full attention first).
    yield "qwen35_bf16_odd_heads", text_config(
        hidden_size=256, intermediate_size=128, num_hidden_layers=4, num_attention_heads=3, num_key_value_heads=1,
        head_dim=64, linear_num_key_heads=3, linear_num_value_heads=9, linear_key_head_dim=32,
        linear_value_head_dim=24, layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
        tie_word_embeddings=False, rope_parameters=rope(1e7, 64)), big


def randomize(model, gen, init):
    # Norms near their identity (Qwen3_5RMSNorm scales by 1 + w: w near 0; the gated norm by w: near 1),
    # the conv wide enough to matter, everything else small normal. With init.bf16 every weight is then
    # rounded to a bf16 value (kept in fp32), so that the GPU's bf16 step (HybridHfStepBf16) is measured
    # without the weight rounding. The small fixtures keep full fp32 weights: with bf16 ones
    # (--bf16-weights) they still miss the 0.99 gradient cosine (0.979, 0.924; docs/notes.md 0b).
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen)
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * r)
            elif name.endswith("norm.weight"):
                p.copy_(0.2 * r)
            elif name.endswith("conv1d.weight"):
                p.copy_(0.3 * r)
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.rand(p.shape, generator=gen) * 4.0 + 0.05))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * r)
            else:
                p.copy_(matrix_std(p, init) * r)
            if init.bf16:
                p.copy_(p.to(torch.bfloat16).float())


def matrix_std(p, init):
    return init.matrix_gain / math.sqrt(p.shape[-1]) if init.matrix_gain else 0.08


def batch(gen):
    ids = torch.randint(3, VOCAB, (B, S), generator=gen)
    labels = ids.clone()
    labels[0, :4] = -100
    labels[1, 5] = -100
    labels[1, 61] = -100
    labels[1, S - 2] = -100
    return ids, labels


def build(cfg_kw, init):
    torch.manual_seed(1234)
    cfg = Qwen3_5TextConfig(**cfg_kw)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    randomize(model, torch.Generator().manual_seed(1234), init)
    return model


def save_dir(model, d):
    if os.path.isdir(d):
        shutil.rmtree(d)
    model.save_pretrained(d, safe_serialization=True)
    for extra in os.listdir(d):
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(d, extra))


def make_one(name, cfg_kw, init, out, device):
    model = build(cfg_kw, init).to(device).train()
    ids, labels = batch(torch.Generator().manual_seed(99))
    outp = model(input_ids=ids.to(device), labels=labels.to(device))
    outp.loss.backward()
    d = os.path.join(out, name)
    save_dir(model, d)
    fx = {"input_ids": ids.contiguous(), "labels": labels.contiguous(),
          "logits": outp.logits.detach().float().cpu().contiguous(),
          "loss": outp.loss.detach().float().cpu().reshape(())}
    for pname, p in model.named_parameters():
        fx["grad." + pname] = p.grad.detach().float().cpu().contiguous()
    model.eval()
    prompt = ids[:1, :10].to(device)
    with torch.no_grad():
        gen = model.generate(prompt, max_new_tokens=12, do_sample=False, use_cache=True, eos_token_id=None,
                             pad_token_id=0)
    fx["gen.prompt"] = prompt.cpu().clone().contiguous()
    fx["gen.tokens"] = gen[:, 10:].cpu().contiguous()
    save_file(fx, os.path.join(d, "fixture.safetensors"))
    print(f"{name}: loss={outp.loss.item():.6f} params={sum(p.numel() for p in model.parameters())} "
          f"gen={fx['gen.tokens'].tolist()} -> {d}")
    return model


def make_packed(model, out, device):
    gen = torch.Generator().manual_seed(7)
    a, b = torch.randint(3, VOCAB, (1, 30), generator=gen), torch.randint(3, VOCAB, (1, 50), generator=gen)
    packed = torch.cat([a, b], dim=1)
    pos = torch.cat([torch.arange(30), torch.arange(50)])
    model.eval()
    with torch.no_grad():
        sep = torch.cat([model(input_ids=a.to(device)).logits[0], model(input_ids=b.to(device)).logits[0]])
        hf = model(input_ids=packed.to(device), position_ids=pos[None].to(device)).logits[0]
    leak = (hf[30:] - sep[30:]).abs().max().item()
    save_file({"packed.input_ids": packed.contiguous(), "packed.positions": pos.to(torch.int64).contiguous(),
               "packed.separate_logits": sep.float().cpu().contiguous(), "packed.hf_logits": hf.float().cpu().contiguous()},
              os.path.join(out, "qwen35_tied_3to1", "packed.safetensors"))
    print(f"packed: HF packed row vs separate runs, second sample max |logit diff| = {leak:.4g}")


def make_composite(text_kw, causal, out, device):
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text_kw["hidden_size"],
                  patch_size=4, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)
    cfg = Qwen3_5Config(text_config=dict(text_kw), vision_config=vision,
                        tie_word_embeddings=text_kw.get("tie_word_embeddings", False))
    torch.manual_seed(4321)
    comp = Qwen3_5ForConditionalGeneration(cfg).to(torch.float32)
    src = {k: v.detach().cpu() for k, v in causal.state_dict().items()}
    dst = comp.state_dict()
    with torch.no_grad():
        for k in list(dst.keys()):
            if k.startswith("model.language_model."):
                dst[k].copy_(src["model." + k[len("model.language_model."):]].to(torch.bfloat16).float())
            elif k == "lm_head.weight":
                dst[k].copy_(src["lm_head.weight"].to(torch.bfloat16).float())
    comp.load_state_dict(dst)
    d = os.path.join(out, "qwen35_composite")
    if os.path.isdir(d):
        shutil.rmtree(d)
    comp.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    for extra in os.listdir(d):
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(d, extra))
    st = load_file(os.path.join(d, "model.safetensors"))
    g = torch.Generator().manual_seed(5)
    st["mtp.fc.weight"] = torch.randn(text_kw["hidden_size"], 2 * text_kw["hidden_size"], generator=g).to(torch.bfloat16)
    st["mtp.norm.weight"] = torch.randn(text_kw["hidden_size"], generator=g).to(torch.bfloat16)
    save_file(st, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    comp = comp.to(torch.float32).to(device).train()
    ids, labels = batch(torch.Generator().manual_seed(99))
    o = comp(input_ids=ids.to(device), labels=labels.to(device))
    save_file({"input_ids": ids.contiguous(), "labels": labels.contiguous(),
               "logits": o.logits.detach().float().cpu().contiguous(),
               "loss": o.loss.detach().float().cpu().reshape(())}, os.path.join(d, "fixture.safetensors"))
    print(f"qwen35_composite: loss={o.loss.item():.6f} tensors={len(st)} -> {d}")


def selected(only, bf16_weights):
    names = [n for n, _, _ in models(bf16_weights)]
    wanted = set(only.split(",")) if only else set(names)
    unknown = wanted - set(names)
    if unknown:
        sys.exit(f"--only: unknown fixture(s) {', '.join(sorted(unknown))}; known: {', '.join(names)}")
    return [m for m in models(bf16_weights) if m[0] in wanted]


def write_provenance(out, device, made, partial, bf16_weights):
    # A full run rewrites the file; --only adds its fixtures under "fixtures" and keeps the rest.
    path = os.path.join(out, "PROVENANCE_qwen35.json")
    run = {"torch": torch.__version__, "transformers": transformers.__version__, "device": device}
    if partial:
        prov = json.load(open(path)) if os.path.exists(path) else {}
        for name, init in made.items():
            prov.setdefault("fixtures", {})[name] = dict(run, bf16_weights=init.bf16, matrix_gain=init.matrix_gain)
    else:
        prov = dict(run, script="tools/make_hf_fixtures_qwen35.py", batch=B, seq=S, bf16_weights=bf16_weights)
    with open(path, "w") as f:
        json.dump(prov, f, indent=1, sort_keys=True)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                                   "tests", "fixtures", "hf")))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16-weights", action="store_true",
                    help="round the small fixtures' random weights to bf16 values (qwen35_bf16_* always are)")
    ap.add_argument("--only", default=None, help="comma-separated fixture names (default: all)")
    a = ap.parse_args()
    todo = selected(a.only, a.bf16_weights)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    os.makedirs(a.out, exist_ok=True)
    dev = torch.device(a.device)
    made, inits = {}, {}
    for name, kw, init in todo:
        made[name] = (kw, make_one(name, kw, init, a.out, dev))
        inits[name] = init
    if "qwen35_tied_3to1" in made:
        kw, first = made["qwen35_tied_3to1"]
        make_packed(first, a.out, dev)
        make_composite(kw, first, a.out, dev)
    write_provenance(a.out, a.device, inits, a.only is not None, a.bf16_weights)


if __name__ == "__main__":
    main()
