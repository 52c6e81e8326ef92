#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
#
# bench/gpu-train.py: training tokens/s of `stowage train --backend cuda`
# against PyTorch eager on the same LLaMA, the same initial weights and
# tokens, batch and optimizer (AdamW, clipping at 1.0), side by side in one
# run on one GPU, with each one's MFU (model FLOPs 6 N + 12 L h T per token
# against the card's dense bf16 peak).  The PyTorch step is what a user
# writes: the layer of bench/llama-layer.py's math with
# F.scaled_dot_product_attention (flash) for attention, bf16 weights with
# an fp32 master copy kept by the optimizer's fp32 parameters and autocast
# (or all fp32 with --precision fp32), fused AdamW.  Both run --steps
# steps; the first two (warm-up) are dropped and the medians compared.
#
# On the GPU machine (bench/gpu.sh runs it):
#   python3 bench/gpu-train.py --stowage PATH/TO/stowage --out DIR
# Writes DIR/gpu-train.md and prints it.

import argparse
import json
import os
import statistics
import struct
import subprocess
import tempfile
import time

import torch
import torch.nn.functional as F

from benchlib import read_safetensors

# Dense bf16 tensor-core peaks (FLOP/s) of the cards this may run on
# (NVIDIA's datasheets; ../shared/reference hardware numbers).
PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def rms_norm(x, w, eps=1e-6):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (w * y.to(x.dtype))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def layer(p, cos, sin, x, a, k):
    B, T, h = x.shape
    d = h // a
    xn = rms_norm(x, p["attn_norm"])
    q = F.linear(xn, p["wq"]).view(B, T, a, d).transpose(1, 2)
    kk = F.linear(xn, p["wk"]).view(B, T, k, d).transpose(1, 2)
    v = F.linear(xn, p["wv"]).view(B, T, k, d).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    kk = kk * cos + rotate_half(kk) * sin
    if k != a:
        kk = kk.repeat_interleave(a // k, dim=1)
        v = v.repeat_interleave(a // k, dim=1)
    o = F.scaled_dot_product_attention(q, kk, v, is_causal=True)
    x = x + F.linear(o.transpose(1, 2).reshape(B, T, h), p["wo"])
    xn = rms_norm(x, p["mlp_norm"])
    return x + F.linear(F.silu(F.linear(xn, p["wg"])) * F.linear(xn, p["wu"]),
                        p["wd"])


def torch_steps(a, model_dir, toks):
    dev = "cuda"
    hf = read_safetensors(os.path.join(model_dir, "model.safetensors"), dev)
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
                             dict(params=rest, weight_decay=0.0)], lr=1e-4,
                            fused=True)
    d = a.hidden // a.heads
    T, B = a.seq, a.batch
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=dev).float() / d))
    e = torch.outer(torch.arange(T, device=dev).float(), inv)
    e = torch.cat((e, e), dim=-1)
    cos, sin = e.cos(), e.sin()
    bf16 = a.precision == "bf16"
    times, losses = [], []
    toks = toks.to(dev)
    for step in range(a.steps):
        i = step * B * T
        x_ids = toks[i:i + B * T].reshape(B, T)
        y = toks[i + 1:i + B * T + 1].reshape(B, T)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            x = emb[x_ids]
            c, s = (cos.to(torch.bfloat16), sin.to(torch.bfloat16)) if bf16 \
                else (cos, sin)
            for p in layers:
                x = layer(p, c, s, x, a.heads, a.heads)
            logits = F.linear(rms_norm(x, norm), emb)
        loss = F.cross_entropy(logits.float().view(B * T, -1), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return times, losses


def make_model(a, tmp):
    """Writes a LLaMA of @a's dimensions (`stowage init-model`, seed 1) and
    a token shard for a.steps steps under @tmp; returns the model's
    directory, the shard's path and the tokens."""
    cfg = dict(model_type="llama", hidden_size=a.hidden,
               num_hidden_layers=a.layers, num_attention_heads=a.heads,
               num_key_value_heads=a.heads, intermediate_size=a.ffn,
               vocab_size=a.vocab, rope_theta=500000.0, rms_norm_eps=1e-6,
               tie_word_embeddings=not getattr(a, "untied", False),
               initializer_range=0.02)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f)
    model = os.path.join(tmp, "model")
    subprocess.run([a.stowage, "init-model", os.path.join(tmp, "config.json"),
                    "-o", model, "--seed", "1"], check=True,
                   capture_output=True)
    n_tok = a.batch * a.seq * a.steps + 1
    toks = torch.randint(0, a.vocab, (n_tok,),
                         generator=torch.Generator().manual_seed(2))
    shard = os.path.join(tmp, "train.bin")
    with open(shard, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n_tok, *([0] * 253)))
        f.write(toks.numpy().astype("<u2").tobytes())
    return model, shard, toks


def add_model_args(ap):
    ap.add_argument("--stowage", required=True)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=5504)
    ap.add_argument("--vocab", type=int, default=32000)


def main():
    ap = argparse.ArgumentParser()
    add_model_args(ap)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="stow-gpu-bench-")
    model, shard, toks = make_model(a, tmp)
    log = os.path.join(tmp, "log.jsonl")
    trace = os.path.join(a.out, "gpu-train-trace.json")
    cmd = [a.stowage, "train", "--backend", "cuda", "--model", model,
           "--data", shard, "--steps", str(a.steps), "--seq", str(a.seq),
           "--micro-batch", str(a.batch), "--lr", "1e-4",
           "--precision", a.precision, "--out", os.path.join(tmp, "out"),
           "--log-json", log, "--trace", trace]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr)
        raise SystemExit("stowage train failed")
    with open(log) as f:
        rows = [json.loads(line) for line in f]
    s_times = [row["step_time_s"] for row in rows][2:]
    s_loss = [row["loss"] for row in rows]
    t_times, t_loss = torch_steps(a, model, toks)
    t_times = t_times[2:]
    tokens = a.batch * a.seq
    n_params = (a.layers * (4 * a.hidden * a.hidden + 3 * a.hidden * a.ffn
                            + 2 * a.hidden) + a.vocab * a.hidden + a.hidden)
    flops_tok = 6 * n_params + 12 * a.layers * a.hidden * a.seq
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAKS.items() if k in name), None)
    sm, tm = statistics.median(s_times), statistics.median(t_times)

    def mfu(sec):
        return "%.1f%%" % (100 * flops_tok * tokens / sec / peak) if peak \
            else "n/a"
    lines = [
        "# Training tokens/s on the GPU: stowage train --backend cuda vs "
        "PyTorch eager (%s)" % name, "",
        "Model: LLaMA h %d, %d layers, %d heads, f %d, V %d, tied (%s "
        "parameters); seq %d, micro-batch %d, %s, AdamW with clipping at "
        "1.0; torch %s (sdpa attention, fused AdamW%s); %d steps each, the "
        "first two dropped." % (
            a.hidden, a.layers, a.heads, a.ffn, a.vocab, f"{n_params:,}",
            a.seq, a.batch, a.precision, torch.__version__,
            ", autocast bf16 over fp32 parameters" if a.precision == "bf16"
            else "", a.steps), "",
        "| | step median (s) | tokens/s | MFU |",
        "|---|---:|---:|---:|",
        "| stowage train --backend cuda | %.4f | %.0f | %s |" % (
            sm, tokens / sm, mfu(sm)),
        "| PyTorch eager | %.4f | %.0f | %s |" % (tm, tokens / tm, mfu(tm)),
        "",
        "stowage / PyTorch tokens/s: %.2fx (above 1: stowage is faster)."
        % (tm / sm), "",
        "First-step losses (same weights and tokens): stowage %.4f, torch "
        "%.4f." % (s_loss[0], t_loss[0]), "",
        "stowage's last step as a Chrome trace: gpu-train-trace.json.", ""]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "gpu-train-%s.md" % a.precision), "w") as f:
        f.write(text)
    subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
