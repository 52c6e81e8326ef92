#!/usr/bin/python3
# SPDX-License-Identifier: MIT
#
# bench/llama-layer.py: one LLaMA decoder layer's forward + backward, the
# runtime of the cpu backend (executor/llama.c, through the
# llama-layer-bench program) against PyTorch eager on the same shape,
# threads and precision.  The torch layer is HF's modeling_llama math
# written out (the oracle's, tests/oracle/llama_oracle.py): RMSNorm, q/k/v
# projections, rotary, repeat_kv, matmul + causal mask + softmax + matmul,
# o_proj, SwiGLU MLP; autograd for the backward, weights' gradients
# included.  The two alternate, several rounds, because the machine may be
# shared; the best and median of each and their ratio are reported and
# written to bench/results/llama-layer-<host>-<date>.md.
#
# Run with Debian's python (python3-torch) after building:
#   /usr/bin/python3 bench/llama-layer.py --build build --threads 2

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time

import torch

from benchlib import report, stamp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def rms_norm(x, w, eps=1e-6):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    d = x.shape[-1] // 2
    return torch.cat((-x[..., d:], x[..., :d]), dim=-1)


def make_layer(h, a, k, f, T, gen):
    d = h // a
    def lin(o, i):
        return (torch.rand(o, i, generator=gen) * 2 - 1) * (1.7 / math.sqrt(i))
    p = dict(attn_norm=torch.ones(h), wq=lin(a * d, h), wk=lin(k * d, h),
             wv=lin(k * d, h), wo=lin(h, a * d), mlp_norm=torch.ones(h),
             wg=lin(f, h), wu=lin(f, h), wd=lin(h, f))
    for t in p.values():
        t.requires_grad_(True)
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.outer(torch.arange(T).float(), inv)
    emb = torch.cat((emb, emb), dim=-1)
    return p, emb.cos(), emb.sin()


def layer(p, cos, sin, x, a, k):
    B, T, h = x.shape
    d = h // a
    F = torch.nn.functional
    hs = rms_norm(x, p["attn_norm"])
    q = F.linear(hs, p["wq"]).view(B, T, a, d).transpose(1, 2)
    kk = F.linear(hs, p["wk"]).view(B, T, k, d).transpose(1, 2)
    v = F.linear(hs, p["wv"]).view(B, T, k, d).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    kk = kk * cos + rotate_half(kk) * sin
    if a != k:
        kk = kk[:, :, None].expand(B, k, a // k, T, d).reshape(B, a, T, d)
        v = v[:, :, None].expand(B, k, a // k, T, d).reshape(B, a, T, d)
    mask = torch.full((T, T), float("-inf")).triu(1)
    w = torch.softmax(q @ kk.transpose(2, 3) / math.sqrt(d) + mask, dim=-1)
    o = (w @ v).transpose(1, 2).reshape(B, T, a * d)
    x = x + F.linear(o, p["wo"])
    hs = rms_norm(x, p["mlp_norm"])
    m = F.silu(F.linear(hs, p["wg"])) * F.linear(hs, p["wu"])
    return x + F.linear(m, p["wd"])


def torch_times(args, reps):
    gen = torch.Generator().manual_seed(1)
    p, cos, sin = make_layer(args.hidden, args.heads, args.kv_heads, args.ffn,
                             args.seq, gen)
    x0 = torch.rand(args.batch, args.seq, args.hidden, generator=gen) * 2 - 1
    dout = (torch.rand(x0.shape, generator=gen) * 2 - 1) * 1e-3
    times = []
    for it in range(reps + 2):
        x = x0.clone().requires_grad_(True)
        for t in p.values():
            t.grad = None
        t0 = time.perf_counter()
        out = layer(p, cos, sin, x, args.heads, args.kv_heads)
        t1 = time.perf_counter()
        out.backward(dout)
        t2 = time.perf_counter()
        if it >= 2:  # warm-up: allocator, thread pool
            times.append((t1 - t0, t2 - t1, t2 - t0))
    return times


def c_times(args, reps):
    cmd = [os.path.join(args.build, "bench", "llama-layer-bench"),
           "--hidden", str(args.hidden), "--heads", str(args.heads),
           "--kv-heads", str(args.kv_heads), "--ffn", str(args.ffn),
           "--seq", str(args.seq), "--batch", str(args.batch),
           "--threads", str(args.threads), "--reps", str(reps)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout), cmd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=12)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    tt, ct, cmd = [], [], None
    for _ in range(args.rounds):
        tt += torch_times(args, args.reps)
        c, cmd = c_times(args, args.reps)
        ct.append(c)
    t_tot = sorted(t[2] for t in tt)
    t_fwd = sorted(t[0] for t in tt)
    c_tot = sorted(c["total_best_s"] for c in ct)
    c_med = statistics.median(c["total_median_s"] for c in ct)
    c_fwd = min(c["fwd_best_s"] for c in ct)
    host, now = stamp()
    shape = (f"h {args.hidden}, a {args.heads}, k {args.kv_heads}, "
             f"f {args.ffn}, T {args.seq}, B {args.batch}, fp32, "
             f"{args.threads} threads")
    lines = [
        f"# One LLaMA layer, forward + backward ({host}, {now:%Y-%m-%d %H:%M} UTC)",
        "",
        f"Shape: {shape}; torch {torch.__version__} eager "
        f"(torch.set_num_threads({args.threads})); {args.rounds} rounds of "
        f"{args.reps} timed repetitions each, after 2 warm-ups.",
        "",
        "| | forward best (s) | fwd+bwd best (s) | fwd+bwd median (s) |",
        "|---|---:|---:|---:|",
        f"| stowage runtime | {c_fwd:.4f} | {c_tot[0]:.4f} | {c_med:.4f} |",
        f"| PyTorch eager | {t_fwd[0]:.4f} | {t_tot[0]:.4f} | "
        f"{statistics.median(t_tot):.4f} |",
        "",
        f"PyTorch / stowage, fwd+bwd: best {t_tot[0] / c_tot[0]:.2f}x, "
        f"median {statistics.median(t_tot) / c_med:.2f}x "
        "(above 1: the runtime is faster).",
        "",
        "Commands:",
        "",
        f"    /usr/bin/python3 {' '.join(shlex.quote(a) for a in sys.argv)}",
        f"    {' '.join(shlex.quote(a) for a in cmd)}",
    ]
    stem = f"llama-layer-k{args.kv_heads}-b{args.batch}"
    report(stem, host, now, lines, save=not args.no_save)


if __name__ == "__main__":
    main()
