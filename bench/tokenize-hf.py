#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
#
# bench/tokenize-hf.py: data/tokenizer.c against HF tokenizers on the same
# text, in one run: each tokenizer encodes the same documents (the lines of
# a text file) on one thread, best of --runs, and the checksums of the ids
# say whether the two gave the same tokens; then `stowage tokenize` on all
# cores, end to end (reading, encoding, writing the shard), beside HF's
# encode_batch on as many threads.  Writes
# bench/results/tokenize-<host>-<date>.md with the ratios and the commands.
#
# Run in the venv that has tokenizers (tests/oracle/tokenizer_expected.py
# says how to make it), after building:
#   bench/venv-tok/bin/python bench/tokenize-hf.py [--text FILE] [--runs 3]
# Without --text it gathers ~10 MB of /usr/share/doc's changelogs and
# copyright files (English prose and some code) into bench/.work/.

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import benchlib  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "data", "tokenizers")
TOKENIZERS = {"gpt2": "gpt2", "phi3": "phi3-mini", "qwen2": "qwen2.5"}


def hf_child(args):
    """One HF measurement, in a process of its own: RAYON_NUM_THREADS is
    read once, when tokenizers starts its thread pool."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(args.hf_child)
    with open(args.text, encoding="utf-8", newline="") as f:
        docs = f.read().split("\n")
    best = None
    for _ in range(args.runs):
        a = time.perf_counter()
        enc = tok.encode_batch(docs, add_special_tokens=False)
        s = time.perf_counter() - a
        best = s if best is None else min(best, s)
    total, csum = 0, 0
    for e in enc:
        total += len(e.ids)
        for i in e.ids:
            csum = (csum * 1000003 + i) & 0xFFFFFFFFFFFFFFFF
    print(json.dumps({"encode_s": best, "tokens": total,
                      "checksum": "%016x" % csum}))


def corpus(path, size):
    """~size bytes of UTF-8 text from /usr/share/doc, made once."""
    if os.path.exists(path) and os.path.getsize(path) >= size * 0.9:
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    parts, n = [], 0
    for root, _, files in sorted(os.walk("/usr/share/doc")):
        for name in sorted(files):
            p = os.path.join(root, name)
            try:
                if name.endswith(".gz"):
                    with gzip.open(p, "rb") as f:
                        data = f.read()
                elif name == "copyright":
                    with open(p, "rb") as f:
                        data = f.read()
                else:
                    continue
            except OSError:
                continue
            text = data.decode("utf-8", "ignore")
            parts.append(text)
            n += len(text.encode())
            if n >= size:
                break
        if n >= size:
            break
    with open(path + ".tmp", "w", encoding="utf-8", newline="") as f:
        f.write("".join(parts))
    os.replace(path + ".tmp", path)
    return path


def model_dir(name, work):
    """The fixture directory, gunzipped into bench/.work when needed."""
    src = os.path.join(FIXTURES, name)
    if not any(f.endswith(".gz") for f in os.listdir(src)):
        return src
    dst = os.path.join(work, name)
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f.endswith(".gz"):
            with gzip.open(os.path.join(src, f), "rb") as i, \
                    open(os.path.join(dst, f[:-3]), "wb") as o:
                shutil.copyfileobj(i, o)
        else:
            shutil.copy(os.path.join(src, f), dst)
    return dst


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=env)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text")
    ap.add_argument("--size", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--build", default=os.path.join(ROOT, "build-nocuda"))
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--hf-child")
    args = ap.parse_args()
    if args.hf_child:
        hf_child(args)
        return
    work = os.path.join(HERE, ".work", "tokenize")
    text = args.text or corpus(os.path.join(work, "corpus.txt"), args.size)
    nbytes = os.path.getsize(text)
    speed = os.path.join(args.build, "bench", "tokenize-speed")
    stowage = os.path.join(args.build, "cli", "stowage")
    import tokenizers
    host, now = benchlib.stamp()
    lines = [f"# Tokenizing: stowage (data/tokenizer.c) and HF tokenizers "
             f"{tokenizers.__version__}", "",
             f"{host}, {now:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs; "
             f"text: {text} ({nbytes / 1e6:.1f} MB), one document per line; "
             f"best of {args.runs}.", "",
             "One thread: the same documents encoded by each (stowage: "
             "`bench/tokenize-speed TOKENIZER TEXT --lines`, a fresh encoder "
             "per run; HF: `Tokenizer.encode_batch(lines)` with "
             "RAYON_NUM_THREADS=1).  Same ids: the checksums of every id "
             "agree.", "",
             "| tokenizer | tokens | HF s | HF MB/s | stowage s | stowage "
             "MB/s | stowage / HF | same ids |",
             "|---|---|---|---|---|---|---|---|"]
    multi = []
    for label, name in TOKENIZERS.items():
        d = model_dir(name, work)
        tj = os.path.join(d, "tokenizer.json")
        env1 = dict(os.environ, RAYON_NUM_THREADS="1")
        hf = run_json([sys.executable, __file__, "--hf-child", tj, "--text",
                       text, "--runs", str(args.runs)], env=env1)
        ours = run_json([speed, d, text, "--lines", "--repeat",
                         str(args.runs)])
        same = (hf["checksum"] == ours["checksum"]
                and hf["tokens"] == ours["tokens"])
        lines.append(
            f"| {label} | {ours['tokens']:,} | {hf['encode_s']:.2f} | "
            f"{nbytes / 1e6 / hf['encode_s']:.2f} | {ours['encode_s']:.2f} | "
            f"{nbytes / 1e6 / ours['encode_s']:.2f} | "
            f"{hf['encode_s'] / ours['encode_s']:.1f}x faster | "
            f"{'yes' if same else 'NO'} |")
        # All cores: stowage tokenize end to end, HF encode_batch.
        envn = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
        hfn = run_json([sys.executable, __file__, "--hf-child", tj, "--text",
                        text, "--runs", "1"], env=envn)
        best = None
        for _ in range(args.runs):
            a = time.perf_counter()
            subprocess.run([stowage, "tokenize", "--tokenizer", d, "--out",
                            os.path.join(work, label), "--split-lines",
                            "--threads", str(args.threads), text],
                           check=True, capture_output=True)
            s = time.perf_counter() - a
            best = s if best is None else min(best, s)
        multi.append(
            f"| {label} | {hfn['encode_s']:.2f} | "
            f"{nbytes / 1e6 / hfn['encode_s']:.2f} | {best:.2f} | "
            f"{nbytes / 1e6 / best:.2f} | {hfn['encode_s'] / best:.1f}x |")
    lines += ["", f"{args.threads} threads: `stowage tokenize --split-lines "
              f"--threads {args.threads}` end to end (reading, encoding, "
              "writing the shard; blank lines are no documents there), and "
              "HF's encode_batch alone with RAYON_NUM_THREADS="
              f"{args.threads}.", "",
              "| tokenizer | HF s | HF MB/s | stowage tokenize s | MB/s | "
              "stowage / HF |", "|---|---|---|---|---|---|"] + multi
    lines += ["", f"Command: `{' '.join([os.path.relpath(sys.executable, ROOT), 'bench/tokenize-hf.py'] + sys.argv[1:])}`"]
    benchlib.report("tokenize", host, now, lines, save=not args.no_save)


if __name__ == "__main__":
    main()
