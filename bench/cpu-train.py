#!/usr/bin/python3
# SPDX-License-Identifier: MIT
#
# bench/cpu-train.py: training tokens/s of `stowage train` (the cpu backend)
# against PyTorch eager on the same ~110M-parameter LLaMA (h 768, 12 layers
# of 12 heads, f 2048, V 32000, tied), the same initial weights, tokens,
# batch, threads, precision and optimizer (AdamW, clipping at 1.0).  The
# torch step is the layer of bench/llama-layer.py (HF's modeling_llama
# math written out) stacked, with the embedding, the final norm and the
# tied head, in fp32, autograd and torch.optim.AdamW.  Both run the same
# number of steps; the first (warm-up) is dropped and the median and best
# of the rest compared.  Beside it, the step's GEMMs at OpenBLAS's own
# rate on those shapes (bench/sgemm-shapes): how much of the step is
# outside the BLAS.  Results go to bench/results/cpu-train-<host>-<date>.md.
#
# Run with Debian's python (python3-torch) after building:
#   /usr/bin/python3 bench/cpu-train.py --build build --threads 2

import argparse
import importlib.util
import json
import math
import os
import statistics
import struct
import subprocess
import tempfile
import time

import torch

from benchlib import read_safetensors, report, stamp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

spec = importlib.util.spec_from_file_location(
    "llama_layer", os.path.join(HERE, "llama-layer.py"))
ll = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ll)


def torch_steps(a, model_dir, toks):
    """Step times of PyTorch eager on the same model and data."""
    torch.set_num_threads(a.threads)
    hf = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    names = dict(attn_norm="input_layernorm", wq="self_attn.q_proj",
                 wk="self_attn.k_proj", wv="self_attn.v_proj",
                 wo="self_attn.o_proj", mlp_norm="post_attention_layernorm",
                 wg="mlp.gate_proj", wu="mlp.up_proj", wd="mlp.down_proj")
    layers = [{k: hf["model.layers.%d.%s.weight" % (l, v)].requires_grad_(True)
               for k, v in names.items()} for l in range(a.layers)]
    emb = hf["model.embed_tokens.weight"].requires_grad_(True)
    norm = hf["model.norm.weight"].requires_grad_(True)
    params = [emb, norm] + [p for l in layers for p in l.values()]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=0.01),
                             dict(params=rest, weight_decay=0.0)], lr=1e-4)
    d = a.hidden // a.heads
    T, B = a.seq, a.batch
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2).float() / d))
    e = torch.outer(torch.arange(T).float(), inv)
    e = torch.cat((e, e), dim=-1)
    cos, sin = e.cos(), e.sin()
    times, losses = [], []
    for step in range(a.steps):
        i = step * B * T
        x_ids = toks[i:i + B * T].reshape(B, T)
        y = toks[i + 1:i + B * T + 1].reshape(B, T)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        x = emb[x_ids]
        for p in layers:
            x = ll.layer(p, cos, sin, x, a.heads, a.heads)
        logits = torch.nn.functional.linear(ll.rms_norm(x, norm), emb)
        loss = torch.nn.functional.cross_entropy(logits.view(B * T, -1),
                                                 y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return times, losses


def gemm_seconds(a):
    """The step's linear-layer GEMMs at OpenBLAS's rate on each shape:
    forward X W^T, backward dY W and dY^T X, per layer and for the head."""
    n = a.batch * a.seq
    h, f, V = a.hidden, a.ffn, a.vocab
    shapes = [(n, h, h)] * 4 + [(n, f, h)] * 2 + [(n, h, f)]  # per layer
    per_layer = []
    for (m, o, i) in shapes:  # Y (m, o) = X (m, i) W^T
        per_layer += [(m, o, i), (m, i, o), (o, i, m)]
    head = [(n, V, h), (n, h, V), (V, h, n)]
    exe = os.path.join(a.build, "bench", "sgemm-shapes")
    args = [exe, "--threads", str(a.threads)]
    for (m, nn, k) in per_layer + head:
        args += ["%dx%dx%d" % (m, nn, k)]
    out = json.loads(subprocess.run(args, check=True, capture_output=True,
                                    text=True).stdout)
    secs = out["seconds"]
    layer_s = sum(secs[:len(per_layer)])
    head_s = sum(secs[len(per_layer):])
    flops = sum(2.0 * m * nn * k for (m, nn, k) in per_layer) * a.layers \
        + sum(2.0 * m * nn * k for (m, nn, k) in head)
    return layer_s * a.layers + head_s, flops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--no-save", action="store_true")
    a = ap.parse_args()
    stowage = os.path.join(a.build, "cli", "stowage")
    tmp = tempfile.mkdtemp(prefix="stow-bench-")
    cfg = dict(model_type="llama", hidden_size=a.hidden,
               num_hidden_layers=a.layers, num_attention_heads=a.heads,
               num_key_value_heads=a.heads, intermediate_size=a.ffn,
               vocab_size=a.vocab, rope_theta=500000.0, rms_norm_eps=1e-6,
               tie_word_embeddings=True, initializer_range=0.02)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f)
    model = os.path.join(tmp, "model")
    subprocess.run([stowage, "init-model", os.path.join(tmp, "config.json"),
                    "-o", model, "--seed", "1"], check=True,
                   capture_output=True)
    n_tok = a.batch * a.seq * a.steps + 1
    toks = torch.randint(0, a.vocab, (n_tok,),
                         generator=torch.Generator().manual_seed(2))
    shard = os.path.join(tmp, "train.bin")
    with open(shard, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n_tok, *([0] * 253)))
        f.write(toks.numpy().astype("<u2").tobytes())
    log = os.path.join(tmp, "log.jsonl")
    cmd = [stowage, "train", "--model", model, "--data", shard,
           "--steps", str(a.steps), "--seq", str(a.seq),
           "--micro-batch", str(a.batch), "--lr", "1e-4",
           "--threads", str(a.threads), "--out", os.path.join(tmp, "out"),
           "--log-json", log]
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    with open(log) as f:
        rows = [json.loads(line) for line in f]
    s_times = [row["step_time_s"] for row in rows][1:]
    s_loss = [row["loss"] for row in rows]
    t_times, t_loss = torch_steps(a, model, toks)
    t_times = t_times[1:]
    gemm_s, gemm_flops = gemm_seconds(a)
    tokens = a.batch * a.seq
    params = sum(x.numel() for x in read_safetensors(
        os.path.join(model, "model.safetensors")).values())
    sm, tm = statistics.median(s_times), statistics.median(t_times)
    host, now = stamp()
    lines = [
        "# Training tokens/s: stowage train (cpu backend) vs PyTorch eager "
        "(%s, %s UTC)" % (host, now.strftime("%Y-%m-%d %H:%M")), "",
        "Model: LLaMA h %d, %d layers, %d heads, f %d, V %d, tied: %s "
        "parameters; seq %d, micro-batch %d, fp32, AdamW with clipping, "
        "%d threads; torch %s eager (torch.set_num_threads(%d)); %d steps "
        "each, the first dropped." % (
            a.hidden, a.layers, a.heads, a.ffn, a.vocab, f"{params:,}", a.seq,
            a.batch, a.threads, str(torch.__version__), a.threads,
            a.steps), "",
        "| | step median (s) | step best (s) | tokens/s (median) |",
        "|---|---:|---:|---:|",
        "| stowage train | %.3f | %.3f | %.0f |" % (sm, min(s_times),
                                                   tokens / sm),
        "| PyTorch eager | %.3f | %.3f | %.0f |" % (tm, min(t_times),
                                                   tokens / tm), "",
        "stowage / PyTorch tokens/s: median %.2fx, best %.2fx (above 1: "
        "stowage is faster)." % (tm / sm, min(t_times) / min(s_times)), "",
        "Losses of the first step: stowage %.4f, torch %.4f (same weights "
        "and tokens)." % (s_loss[0], t_loss[0]), "",
        "The step's linear-layer GEMMs (%.1f GFLOP) take %.3f s at "
        "OpenBLAS's own rate on each shape (bench/sgemm-shapes, %d threads, "
        "best of 3): %.0f%% of stowage's median step; the rest (%.0f%%) is "
        "attention, the element-wise kernels, the loss and Adam." % (
            gemm_flops / 1e9, gemm_s, a.threads,
            100 * gemm_s / sm, 100 * (1 - gemm_s / sm)), "",
        "Commands:", "",
        "    /usr/bin/python3 bench/cpu-train.py --build %s --threads %d "
        "--steps %d" % (os.path.relpath(a.build, ROOT), a.threads, a.steps),
        "    " + " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT)
                          else c for c in cmd[:1]) + " train ...", ""]
    report("cpu-train", host, now, lines, save=not a.no_save)
    subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
