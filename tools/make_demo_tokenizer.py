#!/usr/bin/env python3
"""Builds the demo model's tokenizer: a small byte-level BPE with the exact Qwen2 pre-tokenizer
(digits split one by one), NFC normaliser and the ChatML special tokens, trained on text in the
format of lazytrain's built-in synthetic math data (src/data/synth_math.cpp).

Needs: pip install tokenizers  (the committed files: tokenizers 0.23.3)
Run: python3 tools/make_demo_tokenizer.py   (writes configs/demo/tokenizer.json and
tokenizer_config.json; the C++ side only reads them). Deterministic: same files on every run.
"""
import json
import os
import random

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "demo")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
                   " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
                   "{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 320  # 256 bytes + merges; the 3 special tokens come after


def steps(a, op, b):
    """The 'steps' response of synth_math.cpp (column method, least significant digit first)."""
    da, db = [int(c) for c in reversed(str(a))], [int(c) for c in reversed(str(b))]
    parts, c = [], 0
    for i in range(max(len(da), len(db))):
        x = da[i] if i < len(da) else 0
        y = db[i] if i < len(db) else 0
        if op == "+":
            s = x + y + c
            parts.append(f"{x}+{y}+{c}={s}")
            c = s // 10
        else:
            bin_ = c
            c = 1 if x - y - bin_ < 0 else 0
            top = x + 10 * c
            parts.append(f"{top}-{y}-{bin_}={top - y - bin_}")
    return ", ".join(parts)


def corpus():
    rng = random.Random(0)
    out = []
    for _ in range(4000):
        op = rng.choice("+-*")
        a, b = rng.randint(0, 199), rng.randint(0, 199)
        if op == "-" and a < b:
            a, b = b, a
        r = a + b if op == "+" else a - b if op == "-" else a * b
        if op == "*" or rng.random() < 0.3:
            resp = f"{a} {op} {b} = {r}. The answer is: {r}"
        else:
            resp = f"{steps(a, op, b)}. The answer is: {r}"
        out.append(f"<|im_start|>user\nWhat is {a} {op} {b}?<|im_end|>\n<|im_start|>assistant\n{resp}<|im_end|>\n")
    out.append("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" * 50)
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=20, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    # Special tokens are not part of the BPE training text.
    tok.train_from_iterator([t.replace("<|im_start|>", "\n").replace("<|im_end|>", "\n") for t in corpus()],
                            trainer=trainer)
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(os.path.join(OUT, "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                               "single_word": False, "special": True} for t in SPECIALS},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 1024,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    sample = "<|im_start|>user\nWhat is 147 + 38?<|im_end|>\n<|im_start|>assistant\n7+8+0=15, 4+3+1=8, 1+0+0=1. The answer is: 185<|im_end|>\n"
    enc = tok.encode(sample)
    print("vocab", tok.get_vocab_size(), "merges", len(json.loads(tok.to_str())["model"]["merges"]),
          "sample tokens", len(enc.ids))
    print(enc.tokens)


if __name__ == "__main__":
    main()
