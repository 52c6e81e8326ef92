# SPDX-License-Identifier: MIT
#
# tests/oracle/tokenizer_expected.py: the ids HF `tokenizers` gives for the
# test strings, written as tests/data/tokenizers/expected.json, which
# tests/test-tokenizer.c compares data/tokenizer.c against id for id.  Run
# it in a venv with `tokenizers` (0.20 or later) and `transformers` (for the
# model-directory cases: BOS/EOS and the added tokens of
# tokenizer_config.json):
#
#   python3 -m venv bench/venv-tok
#   bench/venv-tok/bin/pip install tokenizers transformers
#   bench/venv-tok/bin/python tests/oracle/tokenizer_expected.py
#
# The tests themselves need neither: the JSON is committed.
import base64
import copy
import gzip
import json
import os
import random
import shutil
import sys
import tempfile

import tokenizers
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "tokenizers")

# llama.cpp's tokenizer test inputs (convert_hf_to_gguf_update.py, `tests`
# and CHK_TXT; the .inp files it writes are these strings).
CHK_TXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ "
    "(multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 "
    "33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? "
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D "
    "you like some tea? We'Ve a'lL"
)
LLAMA_CPP = [
    "ied 4 ½ months", "Äpfel", "", " ", "  ", "   ", "\t", "\n", "\n\n",
    "\n\n\n", "\t\n", "Hello world", " Hello world", "Hello World",
    " Hello World", " Hello World!", "Hello, world!", " Hello, world!",
    " this is 🦙.cpp", "w048 7tuijk dsdfhu", "нещо на Български",
    "កាន់តែពិសេសអាចខលចេញ",
    "🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ (only emoji "
    "that has its own token)",
    "Hello", " Hello", "  Hello", "   Hello", "    Hello",
    "    Hello\n    Hello", " (", "\n =", "' era",
    "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～", "!!!!!!", "3",
    "33", "333", "3333", "33333", "333333", "3333333", "33333333",
    "333333333", "Cửa Việt", " discards", CHK_TXT,
]

# Ours: combining marks, right-to-left text, whitespace of every kind, long
# words, the apostrophe rules, added tokens inside text, NUL and controls.
OURS = [
    # combining marks, precomposed and decomposed (NFC changes the latter)
    "e\u0301te\u0301", "\u00e9t\u00e9", "A\u030angstro\u0308m", "n\u0303",
    "Vie\u0323\u0302t Nam", "\u1100\u1161\u11a8 \uac01", "a\u0300\u0301\u0302\u0303\u0304",
    "\u0301leading mark", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334",
    # right to left
    "مرحبا بالعالم", "שלום עולם", "abc שלום 123 مرحبا!", "\u200fرقم ١٢٣٤\u200e",
    "الْعَرَبِيَّة", "עִבְרִית",
    # other scripts
    "नमस्ते दुनिया", "สวัสดีครับ", "こんにちは世界", "ＡＢＣ１２３", "Ελληνικά",
    "ქართული", "Հայերեն", "ᚠᚢᚦᚨᚱᚲ", "𝗙𝗹𝗮𝘀𝗵 𐏓", "\ue000\U000f0000",
    "Ⅳ ½ ² ١٢ ߁", "\U0010ffff\uffff",
    # whitespace
    "a\u00a0b", "a\u3000\u3000b", "a\u0085b", "a\u2028b", "a\u180eb",
    "a\u200bb", "\ufeffBOM", "a\u1680b", "a\r\nb", "a\rb", "a\x0bb", "a\x0cb",
    "a \u00a0 b", "   \u3000  x", "x\t\t\t", "\n\n\n\n\n", " \n \n ",
    "tab\there", "    four", "        eight spaces", "\r\n\r\n",
    "trailing   ", "  a  b  ",
    # runs where \s decides the split: PCRE2 and Oniguruma must agree
    "x\u180e\u180e\u180ey", "\u0085\u0085x", "a \u00a0\u00a0b",
    "\u2028\u2028x", "\u200b\u200bx", "\u3000\u3000x", "\x0b\x0bx",
    "\x1c\x1d\x1ex", "\ufeff\ufeffx", "\u202f\u205f x", "\u1680\u1680x",
    "a\u180e\u180e\u180e!b", "ab \u180e\u180e cd", "\u180e\u180e\u180e",
    # letters and digits new in Unicode 15 (Oniguruma knows them, PCRE2
    # 10.42 does not): Kawi, CJK Extension H, Nag Mundari
    "Kawi \U00011f04\U00011f05\U00011f06 \U00011f50\U00011f51\U00011f52",
    "\U00031350\U00031351\U00031352x", " \U0001e4d0\U0001e4d1 \U0001e4f0\U0001e4f1",
    "x\U0001e4f0\U0001e4f1\U0001e4f2y",
    # controls
    "a\x00b", "\x01\x02\x7f", "\x1c\x1d\x1e\x1f",
    # apostrophes and case folding
    "it's IT'S It'S it'ſ", "don't won't I'm you're we've they'd I'll",
    "’s ‘quoted’", "'s", "''", "'ll'll", "rock'n'roll",
    # digits
    "1234567890", "3.14159", "1,000,000", "١٢٣٤٥", "0x7fff", "v1.2.3-rc4",
    # long words and runs
    "a" * 1000, "supercalifragilisticexpialidocious" * 30, "9" * 700,
    "ab" * 600, "!" * 300, " " * 500, "\n" * 300, "😀" * 200, "東京" * 300,
    "▁" * 50, "▁Hello▁world",
    # literal strings that look like tokens
    "<0x41><0xFF>", "<unk>", "<s>", "</s>", "<|endoftext|", "|endoftext|>",
    # added tokens in text
    "<|endoftext|>", "Hello<|endoftext|>world", "<|endoftext|><|endoftext|>",
    " <|endoftext|> ", "a</s>b", "a</s>  b", "a</s>\nb", "</s> XML",
    "abc</s> def ghi", "<s>Hi</s>",
    "<|user|>\nHi there<|end|>\n<|assistant|>  Hello!<|end|>",
    "<|system|> <|placeholder1|>x", "<|im_start|>user\nhi<|im_end|>\n",
    "<|im_start|><|im_end|>", "x<|user|>y",
    # emoji
    "🇫🇷🇯🇵", "1️⃣ #️⃣", "👍🏽👩‍👩‍👧‍👦", "❤️‍🔥",
]

POOLS = [
    "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789",
    " " * 8 + "\t\n\r", ".,;:!?'\"()[]{}<>-_/\\|@#$%^&*+=~`",
    "éèêëàâäôöûüçñßøåæœ", "абвгдежзийклмнопрстуфхцчшщъыьэюя",
    "的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着下自之年过发后作里",
    "ひらがなカタカナ", "αβγδεζηθικλμνξοπρστυφχψω", "אבגדהוזחטיכלמנסעפצקרשת",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي", "कखगघङचछजझञटठडढणतथदधन",
    "កខគឃងចឆជឈញ", "\u0300\u0301\u0302\u0308\u0327", "😀😁🦙🚀✅🌫️👍🏽",
    "\u00a0\u3000\u2028\u200b\u0085", "▁", "’“”…–—",
]
WORDS = ["the", " the", "Hello", " world", "'s", "'ll", "<|endoftext|>",
         "</s>", "<|user|>", "<|im_end|>", "http://example.com/a?b=c",
         "int main(void) {", "    return 0;", "}\n", "def f(x):\n    return x",
         "ｆｕｌｌ", "Cửa Việt", "naïve café"]


def random_strings(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 30)):
            if rng.random() < 0.25:
                parts.append(rng.choice(WORDS))
            else:
                pool = rng.choice(POOLS)
                parts.append("".join(rng.choice(pool)
                                     for _ in range(rng.randint(1, 8))))
        out.append("".join(parts))
    return out


def long_document(seed):
    """A document of about 20 kB: paragraphs of the random strings."""
    rng = random.Random(seed)
    paras = []
    size = 0
    while size < 20000:
        p = " ".join(random_strings(rng.randint(2, 6), rng.random()))
        paras.append(p)
        size += len(p.encode())
    return "\n\n".join(paras)


# The variants: a shipped file, and the changes made to its JSON before
# loading (applied the same way by tests/test-tokenizer.c): "set" a member
# at a path, "append" to an array, "merges_to_strings" (["a", "b"] pairs to
# "a b"), "add_vocab" (tokens with the next ids).  They reach configurations no shipped file has: Llama 3's
# ignore_merges and Split regex over GPT-2's vocabulary, Metaspace.
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
VARIANTS = {
    "gpt2": {"file": "gpt2/tokenizer.json", "patch": []},
    "qwen2": {"file": "qwen2.5/tokenizer.json.gz", "patch": []},
    "phi3": {"file": "phi3-mini/tokenizer.json", "patch": []},
    # Llama 3's pipeline: its regex, ignore_merges, BOS by the template.
    "gpt2-llama3": {"file": "gpt2/tokenizer.json", "patch": [
        {"op": "merges_to_strings"},
        {"op": "set", "path": ["model", "ignore_merges"], "value": True},
        {"op": "set", "path": ["pre_tokenizer"], "value": {
            "type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_RE},
                 "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False,
                 "trim_offsets": True, "use_regex": False}]}},
        {"op": "set", "path": ["post_processor"], "value": {
            "type": "Sequence", "processors": [
                {"type": "ByteLevel", "add_prefix_space": True,
                 "trim_offsets": False, "use_regex": True},
                {"type": "TemplateProcessing",
                 "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                            {"Sequence": {"id": "A", "type_id": 0}}],
                 "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                          {"Sequence": {"id": "B", "type_id": 1}}],
                 "special_tokens": {"<|endoftext|>": {
                     "id": "<|endoftext|>", "ids": [50256],
                     "tokens": ["<|endoftext|>"]}}}]}},
        # Added tokens of every kind: lstrip, single_word, normalized ones,
        # one that is already in the vocabulary.
        {"op": "append", "path": ["added_tokens"], "value": {
            "id": 50257, "content": "<|user|>", "single_word": False,
            "lstrip": True, "rstrip": False, "normalized": False,
            "special": True}},
        {"op": "append", "path": ["added_tokens"], "value": {
            "id": 31373, "content": "hello", "single_word": True,
            "lstrip": False, "rstrip": False, "normalized": True,
            "special": False}},
        {"op": "append", "path": ["added_tokens"], "value": {
            "id": 50258, "content": "<|im_end|>", "single_word": False,
            "lstrip": True, "rstrip": True, "normalized": False,
            "special": True}},
    ]},
    # Llama 2 as transformers converts it today (legacy=False): no
    # normalizer, a Metaspace pre-tokenizer that prepends on the first
    # piece only, and a Metaspace decoder.
    "phi3-metaspace": {"file": "phi3-mini/tokenizer.json", "patch": [
        {"op": "set", "path": ["normalizer"], "value": None},
        {"op": "set", "path": ["pre_tokenizer"], "value": {
            "type": "Metaspace", "replacement": "\u2581",
            "prepend_scheme": "first", "split": False}},
        {"op": "set", "path": ["decoder"], "value": {
            "type": "Sequence", "decoders": [
                {"type": "Metaspace", "replacement": "\u2581",
                 "prepend_scheme": "first", "split": False},
                {"type": "ByteFallback"}, {"type": "Fuse"}]}},
    ]},
    # Older SentencePiece conversions: Metaspace splitting on every space.
    "phi3-metaspace-split": {"file": "phi3-mini/tokenizer.json", "patch": [
        {"op": "set", "path": ["normalizer"], "value": {"type": "NFKC"}},
        {"op": "set", "path": ["pre_tokenizer"], "value": {
            "type": "Metaspace", "replacement": "\u2581",
            "prepend_scheme": "always", "split": True}},
        {"op": "set", "path": ["post_processor"], "value": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {
                "<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}},
    ]},
}


def load_json(rel):
    path = os.path.join(DATA, rel)
    if path.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def apply_patch(d, patch):
    d = copy.deepcopy(d)
    for op in patch:
        if op["op"] == "merges_to_strings":
            d["model"]["merges"] = [m if isinstance(m, str) else " ".join(m)
                                    for m in d["model"]["merges"]]
            continue
        if op["op"] == "add_vocab":
            vocab = d["model"]["vocab"]
            n = max(vocab.values()) + 1
            for t in op["tokens"]:
                if t not in vocab:
                    vocab[t] = n
                    n += 1
            continue
        obj = d
        for key in op["path"][:-1]:
            obj = obj[key]
        if op["op"] == "set":
            obj[op["path"][-1]] = op["value"]
        elif op["op"] == "append":
            obj[op["path"][-1]].append(op["value"])
        else:
            raise ValueError(op["op"])
    return d


def model_dir_cases():
    """BOS/EOS and the added tokens of tokenizer_config.json, as
    transformers' AutoTokenizer reads a model directory."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        print("transformers not installed: no model-directory cases",
              file=sys.stderr)
        return {}
    texts = ["Hello world", "<|object_ref_start|>x<|box_end|>", "<|end|>"]
    out = {}
    for name, files in {"phi3-mini": ["tokenizer.json", "tokenizer_config.json"],
                        "qwen2.5": ["tokenizer.json.gz", "tokenizer_config.json"],
                        "gpt2": ["tokenizer.json"]}.items():
        with tempfile.TemporaryDirectory() as tmp:
            for f in files:
                src = os.path.join(DATA, name, f)
                if f.endswith(".gz"):
                    with gzip.open(src, "rb") as i, open(
                            os.path.join(tmp, f[:-3]), "wb") as o:
                        shutil.copyfileobj(i, o)
                else:
                    shutil.copy(src, tmp)
            t = AutoTokenizer.from_pretrained(tmp)
            out[name] = {
                "bos_id": t.bos_token_id, "eos_id": t.eos_token_id,
                "vocab_size": len(t),
                "texts": [{"text": s, "ids": t(s)["input_ids"]} for s in texts],
            }
    return out


def b64(s):
    return base64.b64encode(s.encode()).decode()


QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def add_probes(inputs):
    """The split-probe variants: GPT-2's vocabulary with ignore_merges and
    every piece that HF's pre-tokenizer cuts the short test strings into
    added as a token, so that each piece encodes to one id and the ids show
    the cuts themselves: the regexes through GRegex (PCRE2) against HF's
    Oniguruma, where the two differ (\\s and U+180E, letters and digits new
    in Unicode 15)."""
    short = [s for s in LLAMA_CPP + OURS if len(s) < 200]
    for name, pre in {
        "probe-qwen2-regex": {
            "type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_RE},
                 "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False,
                 "trim_offsets": True, "use_regex": False}]},
        "probe-gpt2-regex": {"type": "ByteLevel", "add_prefix_space": False,
                             "trim_offsets": True, "use_regex": True},
    }.items():
        patch = [{"op": "set", "path": ["model", "ignore_merges"],
                  "value": True},
                 {"op": "set", "path": ["pre_tokenizer"], "value": pre}]
        d = apply_patch(load_json("gpt2/tokenizer.json"), patch)
        tok = Tokenizer.from_str(json.dumps(d))
        pieces = []
        for s in short:
            for p, _ in tok.pre_tokenizer.pre_tokenize_str(s):
                if p not in pieces:
                    pieces.append(p)
        patch.append({"op": "add_vocab", "tokens": pieces})
        VARIANTS[name] = {"file": "gpt2/tokenizer.json", "patch": patch}


def main():
    inputs = LLAMA_CPP + OURS + random_strings(150, 37) + [long_document(7)]
    add_probes(inputs)
    # "text" is for the reader; the tests take "b64" (a NUL survives it).
    cases = [{"text": s, "b64": b64(s)} if len(s) < 120 else {"b64": b64(s)}
             for s in inputs]
    expected = {}
    for name, v in VARIANTS.items():
        d = apply_patch(load_json(v["file"]), v["patch"])
        tok = Tokenizer.from_str(json.dumps(d))
        rows = []
        for s in inputs:
            ids = tok.encode(s, add_special_tokens=False).ids
            row = {"ids": ids}
            # Left out when they say nothing new, to keep the file small.
            special = tok.encode(s, add_special_tokens=True).ids
            if special != ids:
                row["ids_special"] = special
            decoded = tok.decode(ids, skip_special_tokens=True)
            if decoded != s:
                row["decoded_b64"] = b64(decoded)
            kept = tok.decode(ids, skip_special_tokens=False)
            if kept != decoded:
                row["decoded_special_b64"] = b64(kept)
            rows.append(row)
        expected[name] = rows
        print(f"{name}: {len(rows)} strings", file=sys.stderr)
    out = {
        "generator": "tests/oracle/tokenizer_expected.py",
        "tokenizers_version": tokenizers.__version__,
        "variants": VARIANTS,
        "inputs": cases,
        "expected": expected,
        "model_dirs": model_dir_cases(),
    }
    path = os.path.join(DATA, "expected.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}: {os.path.getsize(path)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
