# SPDX-License-Identifier: MIT
#
# tests/oracle/train_oracle.py: `stowage train` against PyTorch.  A small
# LLaMA config is initialised by `stowage init-model`, a token shard written
# in llm.c's format, and 10 steps run twice: by `stowage train` (the cpu
# backend) and here, by the reference decoder of llama_oracle.py in float64
# with torch.optim.AdamW (weight decay on tensors of 2+ dimensions),
# torch.nn.utils.clip_grad_norm_ and the same learning-rate schedule, data
# windows and loss (the mean token cross-entropy of the global batch).
# Each step's loss and every final weight are compared (TOL_LOSS and
# TOL_WEIGHT below), and the worst of each over all cases is printed as a
# claim ("claim oracle.cpu.losses-worst 2.42e-08"), the figures README.md
# quotes (tests/check-claims.py, docs/testing.md).
#
# usage: train_oracle.py --stowage PATH --workdir DIR [--case NAME] [--list]
#                        [--backend cpu|cuda]
# exit 0 within tolerance, 1 a mismatch, 2 a failed run, 77 no torch.
import argparse
import json
import math
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_oracle as lo  # exits 77 when torch is missing
import torch

# Losses: |a - ref| / |ref|; weights: ||a - ref|| / ||ref|| per tensor.
# Both depend on the machine (executor/gemm.c picks the GEMM kernels, and so
# their order of summation, by CPU): on the cpu backend the worst weight was
# 4.42e-5 (layers.2.bk of tied-qkv-bias-recompute) on the machine of issue
# 42 and 3.08e-5 (layers.1.bk) on an Intel Xeon VM with OpenBLAS, 4.82e-5
# on the AMX Xeon VM of issue 40 with oneDNN, the worst loss 3e-8 and
# 2.68e-8; on the cuda backend 6.03e-5 and 9.7e-9 (H100 and H200,
# bench/results/gpu-*-20261126-*/gpu.log).  The sanitizer build CI also
# runs (AddressSanitizer + UBSan) vectorises less, so it sums in another
# order: 5.93e-5 on the same Xeon VM.  Each tolerance is the worst seen
# (over both builds) and a quarter, rounded up.
TOL_LOSS = 4e-8
TOL_WEIGHT = {"cpu": 7.5e-5, "cuda": 7.6e-5}
# Each element is also held to max |a - ref| / max |ref| <= TOL_MAX: AdamW's
# first update of an element is lr sign(g) once |g| passes eps, so an
# element whose gradient is within fp32 rounding of zero can move by lr
# in one run and not the other (seen: 1.0e-4 in one tensor of 10 steps,
# 1.64e-4 on the Xeon), which is why this one is wider than the worst seen.
TOL_MAX = 1e-3
STEPS = 10

# config.json fields, and the run's flags.
CASES = {
    "gqa-untied": dict(
        config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=96,
                    vocab_size=300, rope_theta=500000.0, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, initializer_range=0.05),
        B=2, T=16, G=4, lr=3e-3, warmup=2, schedule="cosine", min_lr=3e-4,
        wd=0.1, clip=1.0, recompute=None),
    "tied-qkv-bias-recompute": dict(
        config=dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=6,
                    num_key_value_heads=2, intermediate_size=80,
                    vocab_size=280, rope_theta=10000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=True, attention_bias=True,
                    initializer_range=0.05),
        B=1, T=24, G=3, lr=2e-3, warmup=0, schedule="linear", min_lr=0.0,
        wd=0.01, clip=0.5, recompute="full"),
    # ZeRO-Offload's delayed parameter update (Ren et al. 2021, 5.2): step
    # s applies step s - 1's gradients (its learning rate, Adam's t = s - 1)
    # while it computes its own on weights that lack them; no clipping.
    "gqa-untied-delayed": dict(
        config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=96,
                    vocab_size=300, rope_theta=500000.0, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, initializer_range=0.05),
        B=2, T=16, G=4, lr=3e-3, warmup=2, schedule="cosine", min_lr=3e-4,
        wd=0.1, clip=0.0, recompute=None, delayed=True,
        flags=["--offload-optimizer", "cpu", "--delayed-update"]),
}


def read_safetensors(path):
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        assert t["dtype"] == "F32", (path, name, t["dtype"])
        arr = np.frombuffer(data[8 + n + a:8 + n + b], dtype="<f4")
        out[name] = torch.from_numpy(arr.copy()).reshape(t["shape"])
    return out


def oracle_params(hf, c):
    """The oracle's names for HF's tensors, float64 leaves."""
    ps = {"embed": hf["model.embed_tokens.weight"],
          "norm": hf["model.norm.weight"]}
    if not c["tied"]:
        ps["lm_head"] = hf["lm_head.weight"]
    names = dict(attn_norm="input_layernorm.weight",
                 wq="self_attn.q_proj.weight", wk="self_attn.k_proj.weight",
                 wv="self_attn.v_proj.weight", wo="self_attn.o_proj.weight",
                 bq="self_attn.q_proj.bias", bk="self_attn.k_proj.bias",
                 bv="self_attn.v_proj.bias", bo="self_attn.o_proj.bias",
                 mlp_norm="post_attention_layernorm.weight",
                 wg="mlp.gate_proj.weight", wu="mlp.up_proj.weight",
                 wd="mlp.down_proj.weight", bg="mlp.gate_proj.bias",
                 bu="mlp.up_proj.bias", bd="mlp.down_proj.bias")
    for l in range(c["n_layers"]):
        for short, long in names.items():
            key = "model.layers.%d.%s" % (l, long)
            if key in hf:
                ps["layers.%d.%s" % (l, short)] = hf[key]
    dt = torch.float32 if os.environ.get("ORACLE_F32") else torch.float64
    return {k: v.to(dt).clone().requires_grad_(True) for k, v in ps.items()}


def hf_name(short, c):
    """The HF name of an oracle parameter (inverse of oracle_params)."""
    if short == "embed":
        return "model.embed_tokens.weight"
    if short == "norm":
        return "model.norm.weight"
    if short == "lm_head":
        return "lm_head.weight"
    _, l, s = short.split(".")
    table = dict(attn_norm="input_layernorm.weight", wq="self_attn.q_proj.weight",
                 wk="self_attn.k_proj.weight", wv="self_attn.v_proj.weight",
                 wo="self_attn.o_proj.weight", bq="self_attn.q_proj.bias",
                 bk="self_attn.k_proj.bias", bv="self_attn.v_proj.bias",
                 bo="self_attn.o_proj.bias",
                 mlp_norm="post_attention_layernorm.weight",
                 wg="mlp.gate_proj.weight", wu="mlp.up_proj.weight",
                 wd="mlp.down_proj.weight")
    return "model.layers.%s.%s" % (l, table[s])


def lr_at(case, step):
    """program/program.c's stow_optim_lr_at."""
    lr, warm = case["lr"], case["warmup"]
    if warm and step <= warm:
        return lr * step / warm
    span = max(STEPS - warm, 1)
    frac = min(1.0, (step - warm) / span)
    k = 0.5 * (1 + math.cos(math.pi * frac)) if case["schedule"] == "cosine" \
        else 1 - frac
    return case["min_lr"] + (lr - case["min_lr"]) * k


def run_case(name, stowage, work, backend="cpu", worsts=None):
    """Runs one case; adds its worst loss and weight errors to @worsts."""
    case = CASES[name]
    if case.get("delayed") and backend != "cpu":
        print("%s: skipped (the delayed update runs on the cpu backend)" %
              name)
        return 0
    cfg = dict(model_type="llama", **case["config"])
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    model = os.path.join(d, "model")
    r = subprocess.run([stowage, "init-model", cfg_path, "-o", model,
                        "--seed", "7"], capture_output=True, text=True)
    if r.returncode != 0:
        print("%s: init-model failed: %s" % (name, r.stderr))
        return 2
    # A token shard in llm.c's format: 256 int32 of header, uint16 tokens.
    V, B, T, G = cfg["vocab_size"], case["B"], case["T"], case["G"]
    gen = torch.Generator().manual_seed(11)
    n_tok = B * T * (G // B) * STEPS + 1 + 17
    toks = torch.randint(0, V, (n_tok,), generator=gen)
    shard = os.path.join(d, "train.bin")
    with open(shard, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n_tok, *([0] * 253)))
        f.write(toks.numpy().astype("<u2").tobytes())
    out = os.path.join(d, "out")
    log = os.path.join(d, "log.jsonl")
    cmd = [stowage, "train", "--model", model, "--data", shard,
           "--steps", str(STEPS), "--seq", str(T), "--micro-batch", str(B),
           "--global-batch", str(G), "--lr", repr(case["lr"]),
           "--min-lr", repr(case["min_lr"]), "--warmup", str(case["warmup"]),
           "--lr-schedule", case["schedule"],
           "--weight-decay", repr(case["wd"]),
           "--max-grad-norm", repr(case["clip"]), "--out", out,
           "--log-json", log, "--threads", "2", "--backend", backend]
    if case["recompute"]:
        cmd += ["--recompute", case["recompute"]]
    cmd += case.get("flags", [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print("%s: stowage train failed (%d): %s" % (name, r.returncode,
                                                     r.stderr))
        return 2
    with open(log) as f:
        got = [json.loads(line)["loss"] for line in f]

    c = dict(hidden=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"],
             n_heads=cfg["num_attention_heads"],
             n_kv_heads=cfg["num_key_value_heads"],
             head_dim=cfg["hidden_size"] // cfg["num_attention_heads"],
             vocab=V, rope_theta=cfg["rope_theta"],
             rms_norm_eps=cfg["rms_norm_eps"], rope_factor=0.0,
             tied=1 if cfg["tie_word_embeddings"] else 0)
    ps = oracle_params(read_safetensors(os.path.join(model,
                                                     "model.safetensors")), c)
    decay = [p for k, p in ps.items() if p.dim() >= 2]
    no_decay = [p for k, p in ps.items() if p.dim() < 2]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=case["wd"]),
                             dict(params=no_decay, weight_decay=0.0)],
                            lr=case["lr"], betas=(0.9, 0.999), eps=1e-8)
    accum = G // B
    worst = 0.0
    delayed = case.get("delayed", False)
    prev = None  # the delayed update's gradients of the step before
    for step in range(1, STEPS + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(case, step)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in range(accum):
            i = ((step - 1) * accum + mb) * B * T
            x = toks[i:i + B * T].reshape(B, T)
            y = toks[i + 1:i + B * T + 1].reshape(B, T)
            _, loss = lo.reference(c, ps, x, y)
            (loss / accum).backward()
            total += loss.item() / accum
        if delayed:
            now = [p.grad.clone() for p in ps.values()]
            if prev is not None:
                for g in opt.param_groups:
                    g["lr"] = lr_at(case, step - 1)
                for p, g in zip(ps.values(), prev):
                    p.grad = g
                opt.step()
            prev = now
        else:
            if case["clip"] > 0:
                torch.nn.utils.clip_grad_norm_(list(ps.values()), case["clip"])
            opt.step()
        err = abs(got[step - 1] - total) / abs(total)
        worst = max(worst, err)
        print("%s: step %d loss %.8f, torch %.8f (%.2e)" %
              (name, step, got[step - 1], total, err))
    final = read_safetensors(os.path.join(out, "latest", "model.safetensors"))
    status = 0 if worst <= TOL_LOSS else 1
    worst_loss, worst = worst, 0.0
    worst_max = 0.0
    for short, p in ps.items():
        a, ref = final[hf_name(short, c)].double(), p.detach().double()
        e = ((a - ref).norm() / ref.norm()).item()
        m = lo.rel_err(a, ref)
        if e > TOL_WEIGHT[backend] or m > TOL_MAX:
            status = 1
        worst, worst_max = max(worst, e), max(worst_max, m)
        print("%s: %-20s %.2e (max-element %.2e)" % (name, short, e, m))
    print("%s: worst loss error %.2e (tolerance %.1e), worst weight %.2e "
          "(tolerance %.1e), worst max-element %.2e (tolerance %.0e) %s" %
          (name, worst_loss, TOL_LOSS, worst, TOL_WEIGHT[backend], worst_max,
           TOL_MAX,
           "ok" if status == 0 else "MISMATCH"))
    if worsts is not None:
        worsts["losses"] = max(worsts.get("losses", 0.0), worst_loss)
        worsts["weights"] = max(worsts.get("weights", 0.0), worst)
    return status


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stowage")
    ap.add_argument("--workdir")
    ap.add_argument("--case", action="append")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--backend", default="cpu")
    a = ap.parse_args()
    if a.list:
        print("\n".join(CASES))
        return 0
    if not a.stowage or not a.workdir:
        ap.error("--stowage and --workdir are required")
    status = 0
    worsts = {}
    for name in a.case or list(CASES):
        status = max(status, run_case(name, a.stowage, a.workdir,
                                      a.backend, worsts))
    if not a.case:
        for what, value in sorted(worsts.items()):
            print("claim oracle.%s.%s-worst %.3g" % (a.backend, what, value))
    return status


if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    sys.exit(main())
