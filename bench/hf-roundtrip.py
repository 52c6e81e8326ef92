#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
#
# bench/hf-roundtrip.py: issue 37's last step, checked with transformers
# itself: a model transformers saved (tests/data/hf-tiny, bf16 shards) with
# Phi-3-mini's tokenizer, fine-tuned by `stowage train` on prompt/completion
# JSONL with the optimizer in host memory, then OUT/latest loaded by
# AutoModelForCausalLM and AutoTokenizer: no missing or unexpected keys, the
# tokenizer's ids those stowage trained on, and transformers' loss on the
# validation batches equal to the validation loss stowage logged (the same
# logits, the same mean over the completions' tokens).  Not part of the test
# suite: transformers comes from PyPI (bench/engine-check-venv.sh's venv).
#
#   bench/engine-check-venv.sh
#   bench/venv-ds/bin/python bench/hf-roundtrip.py --stowage build/cli/stowage
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "oracle"))

import torch  # noqa: E402
import transformers  # noqa: E402
from train_oracle import read_tokens  # noqa: E402

B, T, G, STEPS, K = 2, 64, 8, 10, 2


def model_dir(d):
    import shutil
    model = os.path.join(d, "model")
    os.makedirs(model)
    for src in ("hf-tiny", os.path.join("tokenizers", "phi3-mini")):
        full = os.path.join(ROOT, "tests", "data", src)
        for f in os.listdir(full):
            if f != "make.py":
                shutil.copy(os.path.join(full, f), model)
    return model


def jsonl(path, n):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({
                "prompt": "How many GPUs does run %d use?" % i,
                "completion": " Run %d uses %d GPUs." % (i, i % 8 + 1)}) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stowage", default=os.path.join(ROOT, "build", "cli",
                                                      "stowage"))
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--workdir")
    a = ap.parse_args()
    d = a.workdir or tempfile.mkdtemp(prefix="hf-roundtrip-")
    os.makedirs(d, exist_ok=True)
    model = model_dir(d)
    data = os.path.join(d, "train.jsonl")
    jsonl(data, 1200)
    prefix = os.path.join(d, "data", "qa")
    subprocess.run([a.stowage, "tokenize", "--tokenizer", model, "--out",
                    prefix, "--val-fraction", "0.1", data], check=True,
                   capture_output=True)
    out = os.path.join(d, "run")
    log = os.path.join(d, "log.jsonl")
    r = subprocess.run(
        [a.stowage, "train", "--model", model, "--data", prefix + "_train.bin",
         "--val-data", prefix + "_val.bin", "--eval-batches", str(K),
         "--offload-optimizer", "cpu", "--precision", a.precision,
         "--seq", str(T), "--micro-batch", str(B), "--global-batch", str(G),
         "--steps", str(STEPS), "--lr", "2e-3", "--warmup", "2",
         "--lr-schedule", "cosine", "--out", out, "--log-json", log],
        capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("stowage train failed: " + r.stderr)
    with open(log) as f:
        last = [json.loads(line) for line in f][-1]
    latest = os.path.join(out, "latest")

    m, info = transformers.AutoModelForCausalLM.from_pretrained(
        latest, output_loading_info=True, dtype=torch.float64)
    tok = transformers.AutoTokenizer.from_pretrained(latest)
    bad = {k: v for k, v in info.items() if v}
    # The ids stowage trained on: the validation shard's first document
    # (up to its EOS) decodes to one of the records, which transformers'
    # tokenizer encodes to those ids.
    toks, keep = read_tokens(prefix + "_val.bin")
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    doc = toks[:toks.tolist().index(eos)].tolist()
    text = tok.decode(doc)
    again = tok(text, add_special_tokens=False)["input_ids"]
    with open(data) as f:
        records = {r["prompt"] + r["completion"]
                   for r in map(json.loads, f)}
    # Validation loss: the mean cross-entropy over the completions' tokens
    # of the first K global batches, as stowage evaluates it.
    m.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for b in range(K * G // B):
            i = b * B * T
            x = toks[i:i + B * T].reshape(B, T)
            y = toks[i + 1:i + B * T + 1].clone()
            y[keep[i + 1:i + B * T + 1] == 0] = -100
            logits = m(x).logits.reshape(B * T, -1)
            total += torch.nn.functional.cross_entropy(
                logits, y, ignore_index=-100, reduction="sum").item()
            n += int((y != -100).sum())
    hf_val = total / n
    rel = abs(hf_val - last["val_loss"]) / hf_val
    ids = tok("How many GPUs does run 7 use?", return_tensors="pt")
    said = tok.decode(m.generate(**ids, max_new_tokens=8, do_sample=False)[0])
    print("# hf-roundtrip (%s, %s)" % (platform.node(), a.precision))
    print("transformers %s, torch %s" % (transformers.__version__,
                                         torch.__version__))
    print("loading info: %s" % (bad or "no missing, unexpected or "
                                "mismatched keys"))
    print("model: %s, %d parameters" % (type(m).__name__,
                                        sum(p.numel() for p in m.parameters())))
    print("tokenizer: %s; the shard's first document %r: %d ids, %s "
          "transformers' encoding of it, %s" % (
              type(tok).__name__, text, len(doc),
              "equal to" if again == doc else "NOT equal to",
              "a record of the JSONL" if text in records else "NOT a record"))
    print("validation loss: stowage %.8f, transformers (float64) %.8f, "
          "relative %.2e over %d targets" % (last["val_loss"], hf_val, rel, n))
    print("generate: %r" % said)
    ok = not bad and rel < (1e-5 if a.precision == "fp32" else 1e-2) and \
        again == doc and text in records
    print("ok" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
