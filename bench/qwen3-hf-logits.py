#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
#
# bench/qwen3-hf-logits.py: the runtime's forward (tests/llama-oracle-run
# over executor/llama.h, fp32) against transformers' own Qwen3ForCausalLM
# on a tiny Qwen3 (head_dim 24, hidden / heads 16, GQA, q/k norm weights
# away from 1) that transformers saves with save_pretrained; the logits of
# the same tokens, beside transformers' fp32 against its fp64, and the
# runtime run without the q/k norms (how far off that is).  A record, not
# a test: the suite's reference is tests/oracle/llama_oracle.py, which
# needs no transformers.  Also `stowage train` two steps from the saved
# model, and AutoModelForCausalLM loads the result with no missing or
# unexpected keys.
#
# Run in a venv with torch and transformers (python3 -m venv V; V/bin/pip
# install torch transformers safetensors), after building:
#   V/bin/python bench/qwen3-hf-logits.py [--build build-nocuda]
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "oracle"))
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (AutoModelForCausalLM, Qwen3Config,  # noqa: E402
                          Qwen3ForCausalLM)

import llama_oracle as lo  # noqa: E402
import train_oracle as to  # noqa: E402


def runtime_logits(runner, c, ps, tokens, tmp):
    inp, out = os.path.join(tmp, "in"), os.path.join(tmp, "out")
    lo.write_input(inp, c, ps, tokens, tokens)
    subprocess.run([runner, inp, out], check=True)
    return lo.read_output(out, c, tokens.numel())[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE),
                                                    "build-nocuda"))
    a = ap.parse_args()
    runner = os.path.join(a.build, "tests", "llama-oracle-run")
    stowage = os.path.join(a.build, "cli", "stowage")
    torch.manual_seed(0)
    cfg = Qwen3Config(hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2,
                      head_dim=24, intermediate_size=96, vocab_size=300,
                      rope_theta=1000000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, max_position_embeddings=128,
                      initializer_range=0.1)
    m = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1, so that they matter
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    B, T = 2, 11
    tokens = torch.randint(0, 300, (B, T),
                           generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory(prefix="qwen3-hf-") as tmp:
        model = os.path.join(tmp, "model")
        m.save_pretrained(model)
        with torch.no_grad():
            hf32 = m(tokens).logits.reshape(B * T, -1)
            hf64 = m.double()(tokens).logits.reshape(B * T, -1)
        c = lo.config("gqa-untied")
        c.update(hidden=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=24,
                 ffn=96, vocab=300, rope_theta=1000000.0, rms_norm_eps=1e-6,
                 qk_norm=1, tied=0, dtype=0, chunk=0)
        hf = to.read_safetensors(model)
        ps = {k: v.detach().float()
              for k, v in to.oracle_params(hf, c, torch.float32).items()}
        got = runtime_logits(runner, c, ps, tokens, tmp)
        c0 = dict(c, qk_norm=0)
        ps0 = {k: v for k, v in ps.items()
               if not k.endswith(("q_norm", "k_norm"))}
        got0 = runtime_logits(runner, c0, ps0, tokens, tmp)

        def row(what, x, ref):
            print("| %s | %.3e | %.3e |" % (what, (x.double() - ref.double())
                                           .abs().max().item(),
                                           lo.rel_err(x, ref)))
        print("transformers %s, torch %s; %d x %d tokens, max |logit| %.3f"
              % (transformers.__version__, torch.__version__, B, T,
                 hf64.abs().max().item()))
        print("\n| logits | max abs | max abs / max abs(ref) |")
        print("|---|---:|---:|")
        row("runtime fp32 vs transformers fp64", got, hf64)
        row("transformers fp32 vs transformers fp64", hf32, hf64)
        row("runtime fp32 vs transformers fp32", got, hf32)
        row("runtime without q/k norms vs transformers fp64", got0, hf64)

        text = os.path.join(tmp, "text.txt")
        with open(text, "w") as f:
            f.write(" ".join(["the model fits on eight GPUs"] * 800))
        out = os.path.join(tmp, "trained")
        r = subprocess.run([stowage, "train", "--model", model, "--data", text,
                        "--tokenizer", "bytes", "--out", out, "--steps", "2",
                        "--seq", "16", "--micro-batch", "2",
                        "--global-batch", "4", "--threads", "2",
                        "--precision", "fp32"], capture_output=True,
                       text=True)
        if r.returncode != 0:
            sys.exit("stowage train failed: %s" % r.stderr)
        _, info = AutoModelForCausalLM.from_pretrained(
            os.path.join(out, "latest"), output_loading_info=True)
        print("\nstowage train (2 steps) from the saved model; "
              "AutoModelForCausalLM.from_pretrained of its checkpoint: %s" %
              ({k: v for k, v in info.items() if v} or "no missing, "
               "unexpected or mismatched keys"))


if __name__ == "__main__":
    main()
