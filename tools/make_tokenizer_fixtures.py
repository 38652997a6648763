#!/usr/bin/env python3
"""Builds small tokenizers of the Qwen2 and Llama-3 families with HF `tokenizers`, and the
reference encodings the C++ tokenizer must reproduce exactly (tests/data/test_tokenizer_fixtures.cpp).

Real Qwen/Llama tokenizer files cannot be downloaded here, so we train byte-level BPEs with the
exact pre-tokenizer pipelines of those families on a varied built-in corpus.
Run: python3 tools/make_tokenizer_fixtures.py  (writes tests/fixtures/tokenizer/)
Needs: pip install tokenizers transformers  (the committed files: tokenizers 0.23.3)
"""
import json
import os
import random

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tokenizer")

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Simplified ChatML (no default system prompt) and the Meta Llama-3 Instruct template.
CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
                   " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
                   "{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3_TEMPLATE = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
                   "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
                   "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
                   "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

BASE_TEXT = """
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!
It's a truth universally acknowledged, that a single man in possession of a good fortune must be in want of a wife.
I'm sure they'll say we've done it; you'd think she's right, but they're not. DON'T SHOUT, IT'S LOUD. We'Ve MiXeD.
Training large language models on limited hardware streams layers through the GPU one at a time.
The planner decides where each activation checkpoint lives: GPU memory, CPU DRAM or NVMe.
def forward(self, x):\n    return self.norm(x + self.attn(x))\n\nfor i in range(10):\n\tprint(i * 2)\n
if (a == b && c != d) { return x->y[3] >= 42; } // comment /* block */ #include <vector>
Numbers: 0 1 12 123 1234 12345 3.14159 2,718,281 1e-5 0x1F 2024-06-01 10:55 UTC $19.99 50% 7/8
Café, naïve, résumé, façade, coöperate, Zürich, Ångström, São Paulo, Dvořák, Łódź, Straße, œuvre.
Ελληνικά γράμματα, русский текст, עברית, العربية, हिन्दी, ไทย, 한국어 문장입니다.
大型语言模型的训练需要大量的显存。我们把参数放在主机内存里，逐层流式传输到显卡上。
日本語のテキストも少し入れます。東京は日本の首都です。カタカナとひらがな。
Emoji: 😀 😂 🚀 👍🏽 👨‍👩‍👧 ❤️ 🇫🇷 ✨ and symbols ∑ ∫ √ ≤ ≥ ≠ → ← © ® ™ ° ± µ × ÷ € £ ¥.
Whitespace    runs,   tabs\t\there, trailing spaces   \nnew\n\nlines\r\nwindows line endings\r\n
Question: What is 47 + 38? Answer: 47 + 38 = 85. The answer is: 85
User: hello there! Assistant: Hi, how can I help you today? System: You are a helpful assistant.
"""

TEST_TEXTS = [
    "Hello world! It's a test, isn't it? I'M SURE WE'LL SEE, you'D think.",
    "Café naïve résumé — Zürich Ångström São Paulo. Straße œuvre coöperate.",
    "大型语言模型的训练需要大量的显存。日本語のテキスト。한국어 문장.",
    "Emoji 😀😂🚀 👍🏽 👨‍👩‍👧 ❤️ 🇫🇷✨ math ∑∫√ ≤≥≠ →←",
    "Digits 0 12 123 1234 12345 1234567 3.14159 2,718,281 1e-5 0x1F $19.99 50%",
    "Whitespace    runs   and\ttabs\t\t\tand   \n  newlines\n\n\nand\r\nCRLF\r\n  \n end   ",
    "  leading spaces and trailing   ",
    "\n\n\nonly newlines first",
    "<|im_start|>user\nWhat is 47 + 38?<|im_end|>\n<|im_start|>assistant\n47 + 38 = 85<|im_end|><|endoftext|>",
    "inline<|im_end|>special<|endoftext|>tokens <|im_start|> spaced <|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>",
    "code: def f(x):\n    return x**2  # square\n\tif a != b: pass\n",
    "Combining marks (NFD input): Cafe\u0301 nai\u0308ve A\u030angstro\u0308m e\u0301\u0301 \u1100\u1161\u11a8",
    "Contractions 's 't 're 've 'm 'll 'd 'S 'T 'RE 'Ve 'lL 'x ' s",
    "Unicode spaces:\u00a0nbsp\u2003em\u3000ideographic\u2009thin\u200bzwsp\u0085nel\u2028ls end",
    "Punct!!! ??? ... --- ((( ))) [[x]] {y} \"quoted\" 'single' `back` ~tilde~ ^caret^ |pipe|",
    "Mixed123abc456 abc123 ABC-def_ghi.jkl/mno\\pqr",
    "Rare script: ᚠᛇᚻ ꦗꦮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 ½ ² ³ Ⅻ ① ٣٤٥ ४५६",
    "",
    " ",
    "a",
    "\t\n \r",
]


def corpus():
    rng = random.Random(1234)
    lines = [l for l in BASE_TEXT.split("\n") if l]
    out = []
    for _ in range(60):
        rng.shuffle(lines)
        out.append("\n".join(lines))
        out.append(" ".join(str(rng.randint(0, 99999)) for _ in range(20)))
        out.append(f"What is {rng.randint(0, 199)} + {rng.randint(0, 199)}? The answer is: {rng.randint(0, 400)}")
    return out


def build(family):
    pattern = QWEN2_PATTERN if family == "qwen2" else LLAMA3_PATTERN
    if family == "qwen2":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    else:
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                    "<|eot_id|>"]
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False,
                               ignore_merges=(family == "llama3")))
    if family == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=1500 if family == "qwen2" else 1200, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    # Added tokens after the BPE vocab, as the real files have them.
    tok.add_special_tokens(specials)
    # A non-special added token, to test that path too.
    tok.add_tokens(["<think>"] if family == "qwen2" else ["<|reserved_0|>"])
    if family == "qwen2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    return tok


def chat_cases(family):
    from transformers import PreTrainedTokenizerFast
    return [
        [{"role": "user", "content": "What is 47 + 38?"}, {"role": "assistant", "content": "47 + 38 = 85. The answer is: 85"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  Hi  "},
         {"role": "assistant", "content": "Hello!\n"}, {"role": "user", "content": "Café 大型 😀"},
         {"role": "assistant", "content": "Sure thing."}],
    ]


def main():
    os.makedirs(OUT, exist_ok=True)
    from transformers import PreTrainedTokenizerFast
    for family in ["qwen2", "llama3"]:
        tok = build(family)
        path = os.path.join(OUT, f"{family}_tokenizer.json")
        tok.save(path)
        if family == "qwen2":
            cfg = {"chat_template": CHATML_TEMPLATE, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "bos_token": None}
        else:
            cfg = {"chat_template": LLAMA3_TEMPLATE, "eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>"}
        with open(os.path.join(OUT, f"{family}_tokenizer_config.json"), "w") as f:
            json.dump(cfg, f, indent=1, ensure_ascii=False)
        pre = tok.pre_tokenizer
        cases = []
        for text in TEST_TEXTS:
            enc = tok.encode(text, add_special_tokens=False)
            enc_sp = tok.encode(text, add_special_tokens=True)
            norm = tok.normalizer.normalize_str(text) if tok.normalizer else text
            cases.append({
                "text": text,
                "ids": enc.ids,
                "ids_with_special": enc_sp.ids,
                "pretokens": [p for p, _ in pre_tokenizers.Split(Regex(QWEN2_PATTERN if family == "qwen2" else LLAMA3_PATTERN), behavior="isolated").pre_tokenize_str(norm)],
                "decoded": tok.decode(enc.ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(enc.ids, skip_special_tokens=True),
            })
        # Single code points in context, to pin down the Unicode classes (\s, \p{L}, \p{N}).
        rng = random.Random(7)
        probes = [0x09, 0x0B, 0x0C, 0x1C, 0x1F, 0x85, 0xA0, 0x1680, 0x2000, 0x200A, 0x200B, 0x2028, 0x2029,
                  0x202F, 0x205F, 0x3000, 0xFEFF, 0x00AA, 0x00B2, 0x00BA, 0x0300, 0x0345, 0x0660, 0x2160,
                  0x3007, 0x1D7CE, 0x00BD, 0x2460, 0x02B0, 0x0E33, 0x16EE, 0x10FFFD, 0x017F, 0x212A, 0x0130]
        probes += [rng.randint(0xA0, 0x2FFFF) for _ in range(300)]
        probe_cases = []
        for cp in probes:
            if 0xD800 <= cp <= 0xDFFF:
                continue
            c = chr(cp)
            text = f"a{c}b 1{c}2 {c}{c} '{c} x{c}\n"
            probe_cases.append({"text": text, "ids": tok.encode(text, add_special_tokens=False).ids})
        # Random strings over an alphabet chosen to hit the regex's corner cases (whitespace mixes before
        # letters/punctuation/end, contractions next to letters, digit runs, NFC compositions, specials).
        rng = random.Random(99)
        alphabet = ["a", "B", "z", "é", "e\u0301", "ß", "大", "ー", "😀", "👍🏽", "1", "7", "٣", " ", " ", "  ", "\t",
                    "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "'", "'s", "'LL", "'ve", "'D", "!", "?", ".",
                    "..", "-", "_", "$", "<", ">", "|", "\u0301", "\u200d", "<|im_end|>" if family == "qwen2" else "<|eot_id|>",
                    "<think>" if family == "qwen2" else "<|reserved_0|>", "the", " the", "What", " is"]
        random_cases = []
        for _ in range(400):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 16)))
            random_cases.append([text, tok.encode(text, add_special_tokens=False).ids])
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=cfg["chat_template"],
                                       eos_token=cfg["eos_token"], bos_token=cfg.get("bos_token"))
        chats = []
        for msgs in chat_cases(family):
            ids = fast.apply_chat_template(msgs, tokenize=True, add_generation_prompt=False)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            text = fast.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
            chats.append({"messages": msgs, "ids": list(ids), "text": text})
        with open(os.path.join(OUT, f"{family}_cases.json"), "w") as f:
            json.dump({"family": family, "cases": cases, "probes": probe_cases, "chats": chats, "random": random_cases}, f,
                      ensure_ascii=False, indent=0)
        print(family, "vocab", tok.get_vocab_size(), "cases", len(cases), "probes", len(probe_cases))


if __name__ == "__main__":
    main()
