# SPDX-License-Identifier: MIT
#
# tests/oracle/train_oracle.py: `stowage train` against PyTorch.  A small
# LLaMA (or Qwen3) config is initialised by `stowage init-model`, a token shard written
# in llm.c's format, and 10 steps run twice: by `stowage train` (the cpu
# backend) and here, by the reference decoder of llama_oracle.py in float64
# with torch.optim.AdamW (weight decay on tensors of 2+ dimensions),
# torch.nn.utils.clip_grad_norm_ and the same learning-rate schedule, data
# windows and loss (the mean token cross-entropy of the global batch), and
# where a case evaluates, the validation loss (--val-data) after the same
# steps on the same batches.
# Each step's loss and every final weight are compared (TOL_LOSS and
# TOL_WEIGHT below), and the worst of each over all cases is printed as a
# claim ("claim oracle.cpu.losses-worst 2.42e-08"), the figures README.md
# quotes (tests/check-claims.py, docs/testing.md).  The same steps are run
# in fp32 by PyTorch too, and its distance from the float64 run printed
# beside stowage's (the "torch32" claims): the yardstick of "as close as
# PyTorch fp32", which the supervised fine-tuning case is held to.
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
        wd=0.1, clip=1.0, recompute=None, eval=(5, 2)),
    "tied-qkv-bias-recompute": dict(
        config=dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=6,
                    num_key_value_heads=2, intermediate_size=80,
                    vocab_size=280, rope_theta=10000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=True, attention_bias=True,
                    initializer_range=0.05),
        B=1, T=24, G=3, lr=2e-3, warmup=0, schedule="linear", min_lr=0.0,
        wd=0.01, clip=0.5, recompute="full"),
    # Qwen3 (model_type qwen3): per-head q/k RMSNorm, head_dim 16 where
    # hidden / heads is 12, GQA, tied; the reference follows transformers'
    # Qwen3Attention (llama_oracle.py).  Normed queries and keys make the
    # attention sharp from the first step (the LLaMA cases' start near
    # uniform), and the float64 run parts from every fp32 one sooner:
    # PyTorch's own fp32 run is 1.5e-7 off in loss here (4e-8 is the
    # LLaMA cases' bound; stowage 1.3e-7, and after step 2 both are 1.1e-7
    # off), so the case is held to issue 37's rule, as the masked and hf
    # cases are: as close as PyTorch fp32 gets, and a quarter.
    "qwen3-qk-norm-tied": dict(
        config=dict(model_type="qwen3", hidden_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=80, vocab_size=280,
                    rope_theta=1000000.0, rms_norm_eps=1e-6,
                    tie_word_embeddings=True, initializer_range=0.05),
        B=2, T=16, G=4, lr=3e-3, warmup=2, schedule="cosine", min_lr=3e-4,
        wd=0.1, clip=1.0, recompute=None, peer=True),
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
    # Supervised fine-tuning: a loss mask beside the shard (data/shards.h's
    # format) leaves the prompts' targets out; the loss is the sum over
    # the unmasked targets of the global batch over their count (as
    # transformers' loss with num_items_in_batch).
    "gqa-untied-sft": dict(
        config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=96,
                    vocab_size=300, rope_theta=500000.0, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, initializer_range=0.05),
        B=2, T=16, G=4, lr=3e-3, warmup=2, schedule="cosine", min_lr=3e-4,
        wd=0.1, clip=1.0, recompute=None, mask=True, eval=(5, 2)),
}

# Issue 37's job end to end: a model transformers saved in bf16 shards
# (tests/data/hf-tiny, its make.py) with Phi-3-mini's tokenizer, fine-tuned
# on JSONL (text, and prompt/completion: trained on the completions), the
# JSONL handed to `stowage train --data` as it is (tokenized with the
# model's own tokenizer), with the optimizer on the device, in host memory
# and on NVMe; held to issue 37's rule, as close to the float64 run as
# PyTorch's fp32 run gets.
for kind in ("text", "sft"):
    for where, flags in (("device", []),
                         ("host", ["--offload-optimizer", "cpu"]),
                         ("nvme", ["--offload-optimizer", "nvme",
                                   "--nvme-dir", "NVME"])):
        CASES["hf-%s-%s" % (kind, where)] = dict(
            hf=kind, B=2, T=32, G=4, lr=2e-3, warmup=2, schedule="cosine",
            min_lr=2e-4, wd=0.1, clip=1.0, recompute=None,
            mask=kind == "sft", flags=flags,
            same_as=None if where == "device" else "hf-%s-device" % kind)

MASK_MAGIC = 20261127  # data/shards.h's STOW_MASK_MAGIC
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(os.path.dirname(HERE), "data")


def hf_model_dir(d):
    """tests/data/hf-tiny and Phi-3-mini's tokenizer files, in @d/model."""
    import shutil
    model = os.path.join(d, "model")
    os.makedirs(model, exist_ok=True)
    src = os.path.join(DATA, "hf-tiny")
    for f in os.listdir(src):
        if f != "make.py":
            shutil.copy(os.path.join(src, f), model)
    tok = os.path.join(DATA, "tokenizers", "phi3-mini")
    for f in os.listdir(tok):
        shutil.copy(os.path.join(tok, f), model)
    return model


def hf_jsonl(d, kind, gen):
    """A JSONL corpus of 240 records: text, or prompt and completion."""
    words = ("the model fits on eight GPUs and trains fast with its states "
             "offloaded to host memory or to NVMe while the weights stream "
             "in layer by layer").split()
    path = os.path.join(d, "data.jsonl")
    with open(path, "w") as f:
        for i in range(240):
            n = int(torch.randint(6, 20, (1,), generator=gen))
            ws = [words[int(torch.randint(0, len(words), (1,),
                                          generator=gen))] for _ in range(n)]
            if kind == "sft":
                cut = n // 2
                rec = dict(prompt="Q%d: %s?" % (i, " ".join(ws[:cut])),
                           completion=" " + " ".join(ws[cut:]) + ".")
            else:
                rec = dict(text=" ".join(ws).capitalize() + ".")
            f.write(json.dumps(rec) + "\n")
    return path


def read_tokens(shard):
    """An llm.c uint16 shard's tokens and its mask (all 1 without one)."""
    import numpy as np
    with open(shard, "rb") as f:
        data = f.read()
    magic, version, n = struct.unpack("<3i", data[:12])
    assert magic == 20240520 and version == 1, shard
    toks = torch.from_numpy(
        np.frombuffer(data[1024:1024 + 2 * n], dtype="<u2").astype("int64"))
    keep = torch.ones(n, dtype=torch.uint8)
    mask = shard[:-4] + ".mask"
    if os.path.exists(mask):
        with open(mask, "rb") as f:
            m = f.read()
        keep = torch.from_numpy(np.frombuffer(m[1024:], dtype="u1").copy())
    return toks, keep


def write_tokens(d, name, toks, keep, masked):
    """llm.c's shard of @toks (uint16) and, when @masked, its loss mask."""
    n = len(toks)
    with open(os.path.join(d, name + ".bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(toks.numpy().astype("<u2").tobytes())
    if masked:
        with open(os.path.join(d, name + ".mask"), "wb") as f:
            f.write(struct.pack("<256i", MASK_MAGIC, 1, n, *([0] * 253)))
            f.write(keep.numpy().tobytes())


def prompt_mask(n, gen):
    """Prompt/completion pairs of random lengths: prompts 0."""
    keep = torch.ones(n, dtype=torch.uint8)
    i, prompt = 0, True
    while i < n:
        k = int(torch.randint(2, 12, (1,), generator=gen))
        keep[i:i + k] = 0 if prompt else 1
        i, prompt = i + k, not prompt
    return keep


def read_safetensors(path):
    """A safetensors file's tensors, or a model directory's (one file or
    the shards its index names), F32 or BF16, as float32."""
    import numpy as np
    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        if not os.path.exists(index):
            return read_safetensors(os.path.join(path, "model.safetensors"))
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        out = {}
        for name in files:
            out.update(read_safetensors(os.path.join(path, name)))
        return out
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        if t["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype="<f4").copy()
        else:
            assert t["dtype"] == "BF16", (path, name, t["dtype"])
            arr = (np.frombuffer(raw, dtype="<u2").astype("<u4") << 16) \
                .view("<f4")
        out[name] = torch.from_numpy(arr).reshape(t["shape"])
    return out


def oracle_params(hf, c, dt=torch.float64):
    """The oracle's names for HF's tensors, leaves of @dt."""
    ps = {"embed": hf["model.embed_tokens.weight"],
          "norm": hf["model.norm.weight"]}
    if not c["tied"]:
        ps["lm_head"] = hf["lm_head.weight"]
    names = dict(attn_norm="input_layernorm.weight",
                 wq="self_attn.q_proj.weight", wk="self_attn.k_proj.weight",
                 wv="self_attn.v_proj.weight", wo="self_attn.o_proj.weight",
                 bq="self_attn.q_proj.bias", bk="self_attn.k_proj.bias",
                 bv="self_attn.v_proj.bias", bo="self_attn.o_proj.bias",
                 q_norm="self_attn.q_norm.weight",
                 k_norm="self_attn.k_norm.weight",
                 mlp_norm="post_attention_layernorm.weight",
                 wg="mlp.gate_proj.weight", wu="mlp.up_proj.weight",
                 wd="mlp.down_proj.weight", bg="mlp.gate_proj.bias",
                 bu="mlp.up_proj.bias", bd="mlp.down_proj.bias")
    for l in range(c["n_layers"]):
        for short, long in names.items():
            key = "model.layers.%d.%s" % (l, long)
            if key in hf:
                ps["layers.%d.%s" % (l, short)] = hf[key]
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
                 bo="self_attn.o_proj.bias", q_norm="self_attn.q_norm.weight",
                 k_norm="self_attn.k_norm.weight",
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
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    gen = torch.Generator().manual_seed(11)
    env = dict(os.environ)
    B, T, G = case["B"], case["T"], case["G"]
    masked = case.get("mask", False)
    val = vkeep = None
    if case.get("hf"):
        # The model as transformers saved it; the JSONL as the user has it.
        model = hf_model_dir(d)
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        rope = cfg.get("rope_parameters", {})
        cfg.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
        shard = hf_jsonl(d, case["hf"], gen)
        env["XDG_CACHE_HOME"] = os.path.join(d, "cache")
        V = cfg["vocab_size"]
    else:
        cfg = dict(model_type="llama")
        cfg.update(case["config"])
        cfg_path = os.path.join(d, "config.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        model = os.path.join(d, "model")
        r = subprocess.run([stowage, "init-model", cfg_path, "-o", model,
                            "--seed", "7"], capture_output=True, text=True)
        if r.returncode != 0:
            print("%s: init-model failed: %s" % (name, r.stderr))
            return 2
        # A token shard in llm.c's format: 256 int32 of header, uint16
        # tokens.
        V = cfg["vocab_size"]
        n_tok = B * T * (G // B) * STEPS + 1 + 17
        toks = torch.randint(0, V, (n_tok,), generator=gen)
        shard = os.path.join(d, "train.bin")
        keep = prompt_mask(n_tok, gen) if masked else \
            torch.ones(n_tok, dtype=torch.uint8)
        write_tokens(d, "train", toks, keep, masked)
        # Validation: batches of their own, evaluated every EVERY steps.
        if case.get("eval"):
            every, k = case["eval"]
            n_val = B * T * (G // B) * k + 1 + 5
            val = torch.randint(0, V, (n_val,), generator=gen)
            vkeep = prompt_mask(n_val, gen) if masked else \
                torch.ones(n_val, dtype=torch.uint8)
            write_tokens(d, "val", val, vkeep, masked)
    nvme = os.path.join(d, "nvme")
    os.makedirs(nvme, exist_ok=True)
    out = os.path.join(d, "out")
    log = os.path.join(d, "log.jsonl")
    cmd = [stowage, "train", "--model", model, "--data", shard,
           "--steps", str(STEPS), "--seq", str(T), "--micro-batch", str(B),
           "--global-batch", str(G), "--lr", repr(case["lr"]),
           "--min-lr", repr(case["min_lr"]), "--warmup", str(case["warmup"]),
           "--lr-schedule", case["schedule"],
           "--weight-decay", repr(case["wd"]),
           "--max-grad-norm", repr(case["clip"]), "--out", out,
           "--log-json", log, "--threads", "2", "--backend", backend,
           "--precision", "fp32"]  # the oracle runs fp32; train's default is bf16
    if case["recompute"]:
        cmd += ["--recompute", case["recompute"]]
    cmd += [nvme if f == "NVME" else f for f in case.get("flags", [])]
    if val is not None:
        cmd += ["--val-data", os.path.join(d, "val.bin"), "--eval-every",
                str(case["eval"][0]), "--eval-batches", str(case["eval"][1])]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print("%s: stowage train failed (%d): %s" % (name, r.returncode,
                                                     r.stderr))
        return 2
    with open(log) as f:
        lines = [json.loads(line) for line in f]
    got = [x["loss"] for x in lines]
    got_val = {x["step"]: x["val_loss"] for x in lines if "val_loss" in x}

    if case.get("hf"):
        # The tokens stowage trained on: the shard its tokenizer wrote.
        import glob
        shards = glob.glob(os.path.join(d, "cache", "stowage", "tokens", "*",
                                        "data_train.bin"))
        assert len(shards) == 1, shards
        toks, keep = read_tokens(shards[0])
        if masked != bool((keep == 0).any()):
            print("%s: the shard's mask does not say %s" %
                  (name, "prompts" if masked else "text"))
            return 1
    # An offloaded placement promises the device run's bytes: held to them
    # when that run is here (its PyTorch comparison then holds for both).
    ref_dir = os.path.join(work, case.get("same_as") or "", "out", "latest")
    if case.get("same_as") and os.path.isdir(ref_dir):
        return same_checkpoint(name, case["same_as"], out, ref_dir, got, work)
    c = dict(hidden=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"],
             n_heads=cfg["num_attention_heads"],
             n_kv_heads=cfg["num_key_value_heads"],
             head_dim=cfg.get("head_dim") or
             cfg["hidden_size"] // cfg["num_attention_heads"],
             qk_norm=1 if cfg.get("model_type") == "qwen3" else 0,
             vocab=V, rope_theta=cfg["rope_theta"],
             rms_norm_eps=cfg["rms_norm_eps"], rope_factor=0.0,
             tied=1 if cfg["tie_word_embeddings"] else 0)
    hf = read_safetensors(model)
    ref, ps, ref_val = torch_run(case, c, hf, toks, keep, torch.float64,
                                 val, vkeep)
    final = read_safetensors(os.path.join(out, "latest"))
    stow = losses_and_weights(got, final, ref, ps, c)
    if case.get("hf"):
        # The checkpoint is a model transformers and AutoTokenizer load.
        latest = os.path.join(out, "latest")
        for f in ("tokenizer.json", "tokenizer_config.json",
                  "generation_config.json", "config.json"):
            if not os.path.exists(os.path.join(latest, f)):
                print("%s: %s lacks %s" % (name, latest, f))
                return 1
        with open(os.path.join(latest, "config.json")) as f:
            saved = json.load(f)
        if saved.get("dtype") != "float32" or \
                saved.get("torch_dtype") != "float32":
            print("%s: the checkpoint's config says %s / %s, its weights "
                  "are float32" % (name, saved.get("dtype"),
                                   saved.get("torch_dtype")))
            return 1
    # PyTorch in fp32 against the same float64 run: how close fp32 gets.
    ref32, ps32, _ = torch_run(case, c, hf, toks, keep, torch.float32)
    final32 = {hf_name(k, c): p.detach() for k, p in ps32.items()}
    peer = losses_and_weights(ref32, final32, ref, ps, c)
    for step in range(STEPS):
        print("%s: step %d loss %.8f, torch %.8f (%.2e; torch fp32 %.2e)" %
              (name, step + 1, got[step], ref[step], stow["step"][step],
               peer["step"][step]))
    # The validation losses, held as the step losses are.
    if sorted(got_val) != sorted(ref_val):
        print("%s: evaluated after steps %s, expected %s" %
              (name, sorted(got_val), sorted(ref_val)))
        return 1
    for step in sorted(ref_val):
        e = abs(got_val[step] - ref_val[step]) / abs(ref_val[step])
        stow["step"].append(e)
        stow["loss"] = max(stow["loss"], e)
        print("%s: validation after step %d: %.8f, torch %.8f (%.2e)" %
              (name, step, got_val[step], ref_val[step], e))
    for short in ps:
        print("%s: %-20s %.2e (max-element %.2e; torch fp32 %.2e)" %
              (name, short, stow["tensor"][short][0],
               stow["tensor"][short][1], peer["tensor"][short][0]))
    # The fixed bounds (docs/testing.md), calibrated on the unmasked cases.
    # A masked case (fewer targets, so each step's mean moves more with the
    # rounding of a few) is held to issue 37's own rule: as close to the
    # float64 run as PyTorch fp32 gets on the same case, and a quarter.
    tol_loss, tol_weight = TOL_LOSS, TOL_WEIGHT[backend]
    if case.get("mask") or case.get("hf") or case.get("peer"):
        tol_loss = max(tol_loss, 1.25 * peer["loss"])
        tol_weight = max(tol_weight, 1.25 * peer["weight"])
    ok = (stow["loss"] <= tol_loss and stow["weight"] <= tol_weight
          and stow["max"] <= TOL_MAX)
    print("%s: worst loss error %.2e (tolerance %.1e; torch fp32 %.2e), "
          "worst weight %.2e (tolerance %.1e; torch fp32 %.2e), worst "
          "max-element %.2e (tolerance %.0e) %s" %
          (name, stow["loss"], tol_loss, peer["loss"], stow["weight"],
           tol_weight, peer["weight"], stow["max"], TOL_MAX,
           "ok" if ok else "MISMATCH"))
    if worsts is not None:
        key = "hf-" if case.get("hf") else "sft-" if case.get("mask") else \
            "qwen3-" if case.get("peer") else ""
        for what, v in (("losses", stow["loss"]), ("weights", stow["weight"]),
                         ("torch32-losses", peer["loss"]),
                         ("torch32-weights", peer["weight"])):
            worsts[key + what] = max(worsts.get(key + what, 0.0), v)
    return 0 if ok else 1


def same_checkpoint(name, ref, out, ref_dir, got, work):
    """Whether @out/latest holds @ref's files byte for byte (but for
    run.json, which says how each ran) and @got its losses."""
    with open(os.path.join(work, ref, "log.jsonl")) as f:
        want = [json.loads(line)["loss"] for line in f]
    latest = os.path.join(out, "latest")
    files = sorted(f for f in os.listdir(ref_dir) if f != "run.json")
    mine = sorted(f for f in os.listdir(latest) if f != "run.json")
    differ = [f for f in files if f not in mine or
              open(os.path.join(ref_dir, f), "rb").read() !=
              open(os.path.join(latest, f), "rb").read()]
    if got != want or differ or files != mine:
        print("%s: not %s's bytes (losses %s, files %s)" %
              (name, ref, "equal" if got == want else "differ",
               differ or sorted(set(files) ^ set(mine))))
        return 1
    print("%s: %s's losses and checkpoint, byte for byte (%s) ok" %
          (name, ref, ", ".join(files)))
    return 0


def batch_loss(case, c, ps, toks, keep, k, n_targets=None):
    """Global batch @k (1-based) of @toks: its micro-batches' summed
    cross-entropy over the unmasked targets, over @n_targets (default:
    the batch's own), as a graph to backpropagate."""
    B, T, G = case["B"], case["T"], case["G"]
    accum = G // B
    first = (k - 1) * accum * B * T
    if n_targets is None:
        n_targets = int(keep[first + 1:first + accum * B * T + 1].sum())
    out = []
    for mb in range(accum):
        i = ((k - 1) * accum + mb) * B * T
        x = toks[i:i + B * T].reshape(B, T)
        y = toks[i + 1:i + B * T + 1].clone()
        y[keep[i + 1:i + B * T + 1] == 0] = -100
        logits, _ = lo.reference(c, ps, x, y.reshape(B, T))
        out.append(torch.nn.functional.cross_entropy(
            logits, y, ignore_index=-100, reduction="sum") / n_targets)
    return out


def val_loss(case, c, ps, val, vkeep):
    """The mean cross-entropy over the first K validation batches'
    unmasked targets (stowage's --eval-batches K)."""
    B, T, G = case["B"], case["T"], case["G"]
    k = case["eval"][1]
    n = int(vkeep[1:k * G * T + 1].sum())
    with torch.no_grad():
        return sum(l.item() for b in range(1, k + 1)
                   for l in batch_loss(case, c, ps, val, vkeep, b, n))


def torch_run(case, c, hf, toks, keep, dt, val=None, vkeep=None):
    """The case's steps by the reference decoder in @dt: each step's loss
    (the mean over the global batch's unmasked targets), the final
    parameters, and with @val the validation loss after every step the
    case evaluates at."""
    B, T, G = case["B"], case["T"], case["G"]
    ps = oracle_params(hf, c, dt)
    decay = [p for k, p in ps.items() if p.dim() >= 2]
    no_decay = [p for k, p in ps.items() if p.dim() < 2]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=case["wd"]),
                             dict(params=no_decay, weight_decay=0.0)],
                            lr=case["lr"], betas=(0.9, 0.999), eps=1e-8)
    losses, vals = [], {}
    delayed = case.get("delayed", False)
    prev = None  # the delayed update's gradients of the step before
    for step in range(1, STEPS + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(case, step)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for loss in batch_loss(case, c, ps, toks, keep, step):
            loss.backward()
            total += loss.item()
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
        losses.append(total)
        if val is not None and (step % case["eval"][0] == 0 or step == STEPS):
            vals[step] = val_loss(case, c, ps, val, vkeep)
    return losses, ps, vals


def losses_and_weights(got, final, ref, ps, c):
    """@got's losses and @final's weights (HF names) against the float64
    run's @ref and @ps: per step and per tensor, and the worsts."""
    r = dict(step=[abs(a - b) / abs(b) for a, b in zip(got, ref)], tensor={})
    r["loss"] = max(r["step"])
    r["weight"] = r["max"] = 0.0
    for short, p in ps.items():
        a, b = final[hf_name(short, c)].double(), p.detach().double()
        e = ((a - b).norm() / b.norm()).item()
        m = lo.rel_err(a, b)
        r["tensor"][short] = (e, m)
        r["weight"], r["max"] = max(r["weight"], e), max(r["max"], m)
    return r


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
