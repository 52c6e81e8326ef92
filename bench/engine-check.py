#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
#
# bench/engine-check.py: does the DeepSpeed config stowage emits train the
# run stowage plans?  For ZeRO stages 1, 2 and 3, each with the optimizer on
# the device and offloaded to the CPU: `stowage fit --engine deepspeed
# --emit deepspeed` writes ds_config.json for a tiny LLaMA, and DeepSpeed
# (its CPU accelerator, one gloo process) trains LlamaForCausalLM, loaded
# from `stowage init-model`'s checkpoint, with that config unmodified and
# with the client code its --emit notes ask for (two parameter groups: no
# weight decay on norms), on the data convention of docs/executor.md
# (micro-batch g of the run reads tokens [g B T, g B T + B T + 1)).
# `stowage train --backend cpu` runs the same model, tokens and settings.
# Compared: each step's loss (fp32: within 1e-6 relative), each step's
# learning rate, and the final weights (relative L2 per tensor and over
# all, against the checkpoint stowage wrote).  A last case warms up and
# decays (cosine): DeepSpeed's lr at every step against stowage's, and the
# number of steps that differ against the count `fit --emit` printed in
# its note (losses then differ, and are not held to a tolerance).
# Megatron-LM: `fit --emit megatron`'s schedule flags run through
# megatron-core's own OptimizerParamScheduler, built and stepped as
# megatron/training/training.py does, against the lr stowage train logs
# (its trainer does not run here: see the results file).
#
# --precision bf16 runs the DeepSpeed cases in bf16: the model written
# by `init-model --dtype bf16` (so both sides' fp32 masters start from the
# same values: DeepSpeed makes its master from the bf16 module), the
# config emitted with `fit --precision bf16` (its "bf16": {"enabled":
# true}), `stowage train --precision bf16`; losses within one bf16
# rounding step (2^-8 relative, the unit roundoff of an 8-bit
# significand); weights compared twice: the bf16 weights stowage saves
# against DeepSpeed's bf16 module, and the fp32 master in optimizer.stow
# against DeepSpeed's (safe_get_full_fp32_param).
#
#   bench/engine-check-venv.sh          # once: bench/venv-ds
#   bench/venv-ds/bin/python bench/engine-check.py [--steps 6] [--no-save]
#       [--only deepspeed|megatron] [--precision fp32|bf16]
#       [--cases zero1-device,zero3-cpu,cosine,...]
#
# DeepSpeed builds its CPU ops (fused_adam, cpu_adam, deepspeed_shm_comm)
# into ~/.cache/torch_extensions, keyed on the include paths, so a venv
# run through another path (the bench/venv-ds symlink against the venv's
# real path) rebuilds them: run the venv's python by one path.
#
# Writes bench/results/engine-check[-bf16]-<host>-<date>.md (with the DeepSpeed,
# torch and transformers versions).  On a shared 2-core machine under load
# 11 it took 35 minutes, after DeepSpeed's first build of its CPU
# optimizers (another 15); --only megatron takes a minute.  torchtitan
# is not run: see the results file.

import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

import benchlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The small LLaMA of tests/testutil-train.c (GQA, untied), vocabulary 300.
CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
          "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 96, "vocab_size": 300,
          "rope_theta": 500000.0, "rms_norm_eps": 1e-6,
          "tie_word_embeddings": False, "initializer_range": 0.05,
          "max_position_embeddings": 64}
SEQ, MICRO, GLOBAL = 16, 2, 8
# Settings other than the defaults where a default would hide a mistake:
# a larger lr (weights move), weight decay, betas and eps of their own;
# clipping at 1.0 (the default) binds on this model.
OPTIM = ["--lr", "3e-3", "--weight-decay", "0.1", "--beta2", "0.95",
         "--eps", "1e-7", "--max-grad-norm", "1.0"]
TOL_LOSS = 1e-6
# One bf16 rounding step: round to nearest with an 8-bit significand errs
# by at most 2^-8 relative (half the spacing 2^-7 at 1).
TOL_LOSS_BF16 = 2.0 ** -8
CASES = [f"zero{z}-{o}" for z in (1, 2, 3) for o in ("device", "cpu")] + [
    "cosine"]


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit("failed (%d): %s\n%s%s" % (r.returncode, " ".join(cmd),
                                             r.stdout, r.stderr))
    return r


def write_shard(path, n, vocab, seed=11):
    import random
    rng = random.Random(seed)
    toks = [rng.randrange(vocab) for _ in range(n)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack("<%dH" % n, *toks))


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<3i", data[:12])[2]
    return list(struct.unpack("<%dH" % n, data[1024:1024 + 2 * n]))


# ---- the DeepSpeed side, one process per run ------------------------------

def worker(a):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "RANK": "0",
                       "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    os.environ.setdefault("MASTER_PORT", "29533")
    import torch
    import torch.nn.functional as F
    import deepspeed
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    deepspeed.init_distributed(dist_backend="gloo")
    with open(a.ds_config) as f:
        cfg = json.load(f)
    model = LlamaForCausalLM.from_pretrained(
        a.model, torch_dtype=torch.float32, attn_implementation="eager")
    # What the --emit note asks for: the tensors of 2+ dimensions decay,
    # norms (and biases) do not.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2]},
              {"params": [p for p in params if p.ndim < 2],
               "weight_decay": 0.0}]
    engine, _, _, _ = deepspeed.initialize(model=model,
                                           model_parameters=groups,
                                           config=cfg)
    B = cfg["train_micro_batch_size_per_gpu"]
    ga = cfg["gradient_accumulation_steps"]
    toks = torch.tensor(read_shard(a.data), dtype=torch.long)
    V = model.config.vocab_size
    losses, lrs = [], []
    for step in range(1, a.steps + 1):
        lrs.append(float(engine.optimizer.param_groups[0]["lr"]))
        total = 0.0
        for i in range(ga):
            g = (step - 1) * ga + i
            idx = (torch.arange(B * a.seq + 1) + g * B * a.seq) % len(toks)
            w = toks[idx]
            x = w[:-1].view(B, a.seq)
            y = w[1:].view(B, a.seq)
            logits = engine(input_ids=x).logits
            loss = F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
            engine.backward(loss)
            engine.step()
            total += loss.item()
        losses.append(total / ga)
    names = [n for n, _ in engine.module.named_parameters()]
    ps = [p for _, p in engine.module.named_parameters()]
    with deepspeed.zero.GatheredParameters(ps, enabled=cfg.get(
            "zero_optimization", {}).get("stage", 0) == 3):
        weights = {n: p.detach().float().clone() for n, p in zip(names, ps)}
    torch.save(weights, a.out + ".pt")
    if cfg.get("bf16", {}).get("enabled"):
        # The fp32 master the optimizer steps (the module holds bf16).
        from deepspeed.utils import safe_get_full_fp32_param
        master = {n: safe_get_full_fp32_param(p).detach().float().clone()
                  for n, p in zip(names, ps)}
        torch.save(master, a.out + ".master.pt")
    with open(a.out, "w") as f:
        json.dump({"losses": losses, "lrs": lrs,
                   "optimizer": type(engine.optimizer.optimizer
                                     if hasattr(engine.optimizer, "optimizer")
                                     else engine.optimizer).__name__,
                   "basic_optimizer": type(engine.basic_optimizer).__name__,
                   "scheduler": type(engine.lr_scheduler).__name__,
                   "gradient_clipping": engine.gradient_clipping(),
                   "dtype": str(next(engine.module.parameters()).dtype),
                   "grad_accum_dtype": str(engine.get_data_types()[1])}, f)
    return 0


# ---- the comparison --------------------------------------------------------

def stowage_run(stowage, work, name, model, shard, flags, steps,
                precision="fp32"):
    out = os.path.join(work, name + "-stowage")
    log = out + ".jsonl"
    run([stowage, "train", "--model", model, "--data", shard,
         "--seq", str(SEQ), "--micro-batch", str(MICRO),
         "--global-batch", str(GLOBAL), "--steps", str(steps),
         "--precision", precision, "--threads", "2", "--out", out,
         "--log-json", log] + flags)
    with open(log) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    stowage_run.norms = [r["grad_norm"] for r in rows]
    return ([r["loss"] for r in rows], [r["lr"] for r in rows],
            os.path.join(out, "latest", "model.safetensors"))


def emit(stowage, work, name, model, zero, flags, precision="fp32"):
    path = os.path.join(work, name + ".ds_config.json")
    r = run([stowage, "fit", os.path.join(model, "config.json"),
             "--gpus", "1xA100-80GB", "--engine", "deepspeed",
             "--zero", str(zero), "--offload-params", "none",
             "--recompute", "none", "--seq", str(SEQ),
             "--micro-batch", str(MICRO), "--global-batch", str(GLOBAL),
             "--precision", precision, "--emit", "deepspeed", "-o", path]
            + flags)
    return path, r.stderr


def deepspeed_run(work, name, cfg, model, shard, steps, port):
    out = os.path.join(work, name + "-deepspeed.json")
    env = dict(os.environ, MASTER_PORT=str(port))
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker",
                        "--ds-config", cfg, "--model", model, "--data", shard,
                        "--steps", str(steps), "--seq", str(SEQ),
                        "--out", out], capture_output=True, text=True,
                       env=env)
    if r.returncode != 0:
        sys.exit("DeepSpeed run %s failed (%d):\n%s" % (
            name, r.returncode, r.stderr[-6000:]))
    with open(out) as f:
        res = json.load(f)
    import torch
    res["weights"] = torch.load(out + ".pt")
    if os.path.exists(out + ".master.pt"):
        res["master"] = torch.load(out + ".master.pt")
    return res


def read_master(path):
    """The fp32 master weights of a bf16 run: each tensor's `master`
    section of optimizer.stow (docs/checkpoint-format.md)."""
    import torch
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"STOWOPT\0", path
    hlen = struct.unpack("<Q", data[12:20])[0]
    head = json.loads(data[28:28 + hlen])
    base = 28 + hlen
    out = {}
    for t in head["tensors"]:
        for s in t["sections"]:
            if s["name"] == "master":
                o = base + s["offset"]
                out[t["name"]] = torch.frombuffer(
                    bytearray(data[o:o + s["bytes"]]), dtype=torch.float32)
    return out


def weight_diff(stow_path, ds_weights):
    mine = (stow_path if isinstance(stow_path, dict)
            else benchlib.read_safetensors(stow_path))
    mine = {n: t.float() for n, t in mine.items()}
    worst, worst_name, num, den = 0.0, None, 0.0, 0.0
    weight_diff.equal = weight_diff.total = 0
    for n, t in mine.items():
        if n not in ds_weights:
            continue
        d = ds_weights[n].reshape(t.shape)
        weight_diff.equal += int((t == d).sum())
        weight_diff.total += t.numel()
        e = float((t - d).norm())
        r = e / max(float(t.norm()), 1e-30)
        num += e * e
        den += float(t.norm()) ** 2
        if r > worst:
            worst, worst_name = r, n
    missing = sorted(set(ds_weights) ^ set(mine))
    return math.sqrt(num / den), worst, worst_name, missing

# ---- Megatron-LM's schedule, by megatron-core's own scheduler --------------

# Schedules where Megatron-LM's lr should be stowage's at every step (a
# warmup of 1 or more), and one where the --emit note counts the steps
# that differ (no warmup: Megatron-LM decays from step 1).
MEGATRON_CASES = [
    ("constant", ["--lr-schedule", "constant"]),
    ("constant, warmup 4", ["--lr-schedule", "constant", "--warmup", "4"]),
    ("cosine, warmup 4", ["--lr-schedule", "cosine", "--warmup", "4",
                          "--min-lr", "3e-4"]),
    ("linear, warmup 1", ["--lr-schedule", "linear", "--warmup", "1",
                          "--min-lr", "3e-4"]),
    ("cosine, warmup 2", ["--lr-schedule", "cosine", "--warmup", "2",
                          "--min-lr", "0"]),
    ("cosine, no warmup", ["--lr-schedule", "cosine", "--min-lr", "3e-4"]),
]


def megatron_args(text):
    """The flags of an emitted Megatron-LM arguments file: name -> value
    (True for a switch)."""
    args, words = {}, [w for l in text.splitlines()
                       if not l.startswith("#") for w in l.split()]
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else "--"
            args[w] = True if nxt.startswith("--") else nxt
    return args


def megatron_lrs(args, steps):
    """The lr of each of @steps optimizer steps as Megatron-LM's training
    loop sets it: megatron-core's OptimizerParamScheduler built as
    megatron/training/training.py get_optimizer_param_scheduler builds it
    from these flags (iterations counted in samples of one global batch),
    stepped by one global batch after each optimizer step."""
    from megatron.core.optimizer_param_scheduler import \
        OptimizerParamScheduler

    class Opt:  # what the scheduler touches of a MegatronOptimizer
        param_groups = [{}]

    gbs = int(args["--global-batch-size"])
    train = int(args["--train-iters"])
    decay = int(args.get("--lr-decay-iters", train))
    wd = float(args["--weight-decay"])
    opt = Opt()
    sch = OptimizerParamScheduler(
        opt, init_lr=float(args.get("--lr-warmup-init", 0.0)),
        max_lr=float(args["--lr"]), min_lr=float(args["--min-lr"]),
        lr_warmup_steps=int(args.get("--lr-warmup-iters", 0)) * gbs,
        lr_decay_steps=decay * gbs, lr_decay_style=args["--lr-decay-style"],
        start_wd=wd, end_wd=wd, wd_incr_steps=train * gbs,
        wd_incr_style="constant")
    lrs, wds = [], []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        wds.append(opt.param_groups[0]["weight_decay"])
        sch.step(increment=gbs)
    return lrs, wds


def megatron_check(stowage, work, model, shard):
    """Each case: `fit --engine megatron --emit megatron`, its flags read
    by megatron-core's scheduler, against the lr stowage train logs."""
    import megatron.core
    steps = 12
    lines = ["## Megatron-LM's schedule from the emitted flags "
             f"(megatron-core {megatron.core.__version__})", "",
             "`stowage fit MODEL --gpus 1xA100-80GB --engine megatron "
             f"--seq {SEQ} --micro-batch {MICRO} --global-batch {GLOBAL} "
             f"--precision fp32 --steps {steps} {' '.join(OPTIM)} SCHEDULE "
             "--emit megatron`: its --lr, --min-lr, --lr-decay-style, "
             "--lr-warmup-iters, --lr-warmup-init, --train-iters, "
             "--lr-decay-iters and --weight-decay given to megatron-core's "
             "OptimizerParamScheduler as megatron/training/training.py "
             "does, stepped by one global batch per step; stowage: the lr "
             "`stowage train` logs with the same flags.", "",
             "| schedule | flags emitted | steps whose lr differs | "
             "worst diff | the note's count | weight decay | verdict |",
             "|---|---|---|---|---|---|---|"]
    failed = 0
    for name, sched in MEGATRON_CASES:
        flags = OPTIM + sched + ["--steps", str(steps)]
        r = run([stowage, "fit", os.path.join(model, "config.json"),
                 "--gpus", "1xA100-80GB", "--engine", "megatron",
                 "--seq", str(SEQ), "--micro-batch", str(MICRO),
                 "--global-batch", str(GLOBAL), "--precision", "fp32",
                 "--emit", "megatron"] + flags)
        args = megatron_args(r.stdout)
        mlrs, wds = megatron_lrs(args, steps)
        _, slr, _ = stowage_run(stowage, work, "megatron-" + str(len(lines)),
                                model, shard, flags, steps)
        differ = [k + 1 for k, (x, y) in enumerate(zip(mlrs, slr))
                  if abs(x - y) > 1e-12 * max(x, y)]
        worst = max(abs(x - y) for x, y in zip(mlrs, slr))
        m = re.search(r"Megatron-LM's schedule .*?: (\d+) of", r.stderr)
        noted = int(m.group(1)) if m else 0
        wd_ok = all(w == float(args["--weight-decay"]) for w in wds)
        ok = noted == len(differ) and wd_ok and args["--clip-grad"] == "1.0"
        failed += not ok
        shown = " ".join(f"{k} {args[k]}" for k in (
            "--lr-decay-style", "--lr-warmup-iters", "--lr-warmup-init",
            "--train-iters", "--lr-decay-iters") if k in args)
        lines.append(f"| {name} | `{shown}` | {len(differ)} of {steps} | "
                     f"{worst:.3g} | {noted} | "
                     f"{'constant' if wd_ok else 'NOT constant'} | "
                     f"{'ok' if ok else 'MISMATCH'} |")
        print(name, "megatron", mlrs, "stowage", slr, file=sys.stderr)
    lines += ["", "A case is ok when the steps that differ are the ones "
              "the --emit note counts (none but without a warmup), the "
              "weight decay is --weight-decay at every step and --clip-grad "
              "is the run's 1.0.", ""]
    return lines, failed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ds-config")
    p.add_argument("--model")
    p.add_argument("--data")
    p.add_argument("--out")
    p.add_argument("--seq", type=int, default=SEQ)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--stowage", default=None)
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--only", choices=("deepspeed", "megatron"),
                   help="run one engine's cases (default: both)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="the DeepSpeed cases' precision (default fp32)")
    p.add_argument("--cases", default=",".join(CASES),
                   help="the DeepSpeed cases to run, comma-separated, of "
                   + ", ".join(CASES) + " (default: all)")
    p.add_argument("--port", type=int, default=29533,
                   help="the first of the gloo ports the runs take (29533)")
    a = p.parse_args()
    if a.worker:
        return worker(a)
    cases = [c for c in a.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            p.error(f"--cases: \"{c}\" is none of {', '.join(CASES)}")
    bf16 = a.precision == "bf16"
    tol_loss = TOL_LOSS_BF16 if bf16 else TOL_LOSS

    stowage = a.stowage or next(
        (c for c in (os.path.join(ROOT, "build", "cli", "stowage"),
                     os.path.join(ROOT, "build-nocuda", "cli", "stowage"))
         if os.access(c, os.X_OK)), None)
    if stowage is None:
        sys.exit("no stowage binary: ninja -C build (or give --stowage)")
    import torch
    import transformers
    host, now = benchlib.stamp()
    work = tempfile.mkdtemp(prefix="engine-check-")
    model = os.path.join(work, "model")
    cfg_path = os.path.join(work, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(CONFIG, f)
    run([stowage, "init-model", cfg_path, "-o", model, "--seed", "3"]
        + (["--dtype", "bf16"] if bf16 else []))
    shard = os.path.join(work, "train.bin")
    write_shard(shard, 20000, CONFIG["vocab_size"])
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()

    failed = 0
    if a.only != "megatron":
        import deepspeed
        lines = ["# The emitted DeepSpeed config against stowage train"
                 + (" in bf16" if bf16 else "") +
                 f" ({host}, {now:%Y-%m-%dT%H:%MZ})", "",
                 f"stowage {rev} (`{stowage}`); DeepSpeed {deepspeed.__version__}"
                 f" (PyPI, DS_ACCELERATOR=cpu, one gloo process), torch "
                 f"{torch.__version__}, transformers {transformers.__version__}"
                 f", Python {sys.version.split()[0]}; {os.cpu_count()} CPUs.", "",
                 f"Model: tests/testutil-train.c's small LLaMA (hidden 64, 2 "
                 f"layers, GQA 4/2, vocab 300, untied), `stowage init-model "
                 f"--seed 3{' --dtype bf16' if bf16 else ''}`, loaded by "
                 f"LlamaForCausalLM.from_pretrained (fp32, "
                 f"eager attention). Data: 20000 random tokens, llm.c shard. "
                 f"Run: seq {SEQ}, micro-batch {MICRO}, global batch {GLOBAL} "
                 f"(4 accumulation steps), {a.steps} steps, {a.precision}, "
                 f"`{' '.join(OPTIM)}`.", "",
                 "DeepSpeed reads `stowage fit MODEL --gpus 1xA100-80GB --engine "
                 "deepspeed --zero Z [--offload-optimizer cpu] --precision "
                 f"{a.precision} ... --emit "
                 "deepspeed` unmodified; the script passes the two parameter "
                 "groups the --emit note asks for. stowage: `stowage train "
                 f"--backend cpu --precision {a.precision} "
                 "[--offload-optimizer cpu]`.", ""]
        if bf16:
            lines += [
                "bf16: the checkpoint is bf16, so both fp32 masters start from "
                "the same values (DeepSpeed casts the module to bf16 and makes "
                "its master from that; stowage loads its master from the file "
                "as it is). Two weight comparisons: *bf16 weights*, "
                "model.safetensors of stowage's last checkpoint against "
                "DeepSpeed's bf16 module (gathered), with the share of "
                "elements bit-equal; *fp32 master*, the `master` sections "
                "of stowage's optimizer.stow against DeepSpeed's "
                "`safe_get_full_fp32_param`.", ""]
            lines += ["| ZeRO | optimizer | DeepSpeed's optimizer | dtype, grad "
                      "accumulation | worst loss diff (rel) | lr equal | bf16 "
                      "weights rel L2 (equal) | fp32 master rel L2 (all) | "
                      "master diff / update | fp32 run to stowage's, "
                      "DeepSpeed's master / update | worst master tensor | "
                      "verdict |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        else:
            lines += ["| ZeRO | optimizer | DeepSpeed's optimizer | scheduler | "
                      "worst loss diff (rel) | lr equal | weights rel L2 (all) | "
                      "worst tensor | verdict |",
                      "|---|---|---|---|---|---|---|---|---|"]
        port = a.port
        steps_tab = []
        for zero in (1, 2, 3):
            for off in ("none", "cpu"):
                name = f"zero{zero}-{off}"
                if f"zero{zero}-{'cpu' if off == 'cpu' else 'device'}" \
                        not in cases:
                    continue
                flags = OPTIM + ["--offload-optimizer", off]
                cfg, _ = emit(stowage, work, name, model, zero, flags,
                              a.precision)
                sl, slr, sw = stowage_run(stowage, work, name, model, shard,
                                          OPTIM + ["--offload-optimizer", off],
                                          a.steps, a.precision)
                port += 1
                ds = deepspeed_run(work, name, cfg, model, shard, a.steps, port)
                diffs = [abs(x - y) / abs(y) for x, y in zip(ds["losses"], sl)]
                lr_same = all(abs(x - y) <= 1e-12 * y for x, y in
                              zip(ds["lrs"], slr))
                allw, worst, wname, missing = weight_diff(sw, ds["weights"])
                ok = (max(diffs) <= tol_loss and lr_same and not missing
                      and len(diffs) == a.steps)
                where = 'CPU (offloaded)' if off == 'cpu' else 'device'
                print(name, "losses", sl, ds["losses"], file=sys.stderr)
                steps_tab.append((f"{zero}, {where}", sl, ds["losses"], diffs))
                if bf16:
                    eq = weight_diff.equal / weight_diff.total
                    mw = read_master(os.path.join(os.path.dirname(sw),
                                                  "optimizer.stow"))
                    mall, mworst, mname, mmissing = weight_diff(
                        mw, ds.get("master", {}))
                    # What the 6 steps moved the master, for scale: the
                    # difference over ||stowage's master - initial||.
                    w0 = benchlib.read_safetensors(
                        os.path.join(model, "model.safetensors"))
                    dsm = ds.get("master", {})
                    num = sum(float((mw[n].reshape(t.shape) -
                                     dsm[n].reshape(t.shape)).norm()) ** 2
                              for n, t in w0.items() if n in dsm)
                    upd = sum(float((mw[n].reshape(t.shape) - t.float())
                                    .norm()) ** 2 for n, t in w0.items())
                    rel_upd = math.sqrt(num / upd)
                    # The scale of bf16's own noise: stowage in fp32 from
                    # the same checkpoint, against either bf16 master.
                    _, _, rp = stowage_run(stowage, work, name + "-fp32",
                                           model, shard, flags, a.steps)
                    ref = benchlib.read_safetensors(rp)
                    fl = [math.sqrt(sum(
                        float((m[n].reshape(t.shape) - t.float()).norm()) ** 2
                        for n, t in ref.items()) / upd) for m in (mw, dsm)]
                    ok = ok and not mmissing and "master" in ds
                    lines.append(
                        f"| {zero} | {where} | {ds['basic_optimizer']} | "
                        f"{ds['dtype']}, {ds['grad_accum_dtype']} | "
                        f"{max(diffs):.2e} | {'yes' if lr_same else 'NO'} | "
                        f"{allw:.2e} ({100 * eq:.1f}%) | {mall:.2e} | "
                        f"{rel_upd:.2e} | {fl[0]:.2e}, {fl[1]:.2e} | "
                        f"{mworst:.2e} ({mname}) | "
                        f"{'ok' if ok else 'MISMATCH'} |")
                else:
                    lines.append(
                        f"| {zero} | {where}"
                        f" | {ds['basic_optimizer']} | {ds['scheduler']} | "
                        f"{max(diffs):.2e} | {'yes' if lr_same else 'NO'} | "
                        f"{allw:.2e} | {worst:.2e} ({wname}) | "
                        f"{'ok' if ok else 'MISMATCH'} |")
                failed += not ok
        if steps_tab:
            norms = stowage_run.norms
            lines += ["", f"gradient_clipping as DeepSpeed read it: "
                      f"{ds['gradient_clipping']}; stowage's global norms "
                      f"before clipping: {', '.join(f'{x:.3f}' for x in norms)}"
                      f" (clipping binds at {sum(x > 1.0 for x in norms)} of "
                      f"{len(norms)} steps).", "",
                      f"Tolerance: losses within {tol_loss:g} relative at "
                      "every step"
                      + (" (one bf16 rounding step: 2^-8, the largest "
                         "relative error of rounding to nearest with an "
                         "8-bit significand)" if bf16 else "")
                      + ", the same lr at every step, every tensor present "
                      "in both. Weights are reported, not held to a "
                      "tolerance."
                      + " Per-step losses of the last case, stowage then "
                      "DeepSpeed:", "",
                      "    " + " ".join(f"{x:.9f}" for x in sl),
                      "    " + " ".join(f"{x:.9f}" for x in ds["losses"]), ""]
            if bf16:
                lines += ["### Per-step losses", "",
                          "| case | step | stowage | DeepSpeed | rel diff |",
                          "|---|---|---|---|---|"]
                for case, x, y, d in steps_tab:
                    for k in range(len(x)):
                        lines.append(f"| {case} | {k + 1} | {x[k]:.6f} | "
                                     f"{y[k]:.6f} | {d[k]:.2e} |")
                lines.append("")

        # The schedule: warmup then cosine, the lr DeepSpeed trains each step
        # at against stowage's, and the steps that differ against the note.
        steps = 12
        if "cosine" in cases:
            sched = OPTIM + ["--warmup", "4", "--lr-schedule", "cosine", "--min-lr",
                             "3e-4", "--steps", str(steps)]
            cfg, err = emit(stowage, work, "cosine", model, 2, sched +
                            ["--offload-optimizer", "cpu"], a.precision)
            sl, slr, sw = stowage_run(stowage, work, "cosine", model, shard,
                                      sched + ["--offload-optimizer", "cpu"], steps,
                                      a.precision)
            ds = deepspeed_run(work, "cosine", cfg, model, shard, steps, port + 1)
            differ = [k + 1 for k, (x, y) in enumerate(zip(ds["lrs"], slr))
                      if abs(x - y) > 1e-12 * max(x, y)]
            m = re.search(r"WarmupCosineLR sets the lr .*?: (\d+) of", err)
            noted = int(m.group(1)) if m else 0
            after = all(abs(x - y) <= 1e-12 * max(x, y)
                        for x, y in zip(ds["lrs"][4:], slr[4:]))
            ok = noted == len(differ) and after
            failed += not ok
            with open(cfg) as f:
                sch = json.load(f)["scheduler"]
            lines += ["## The schedule: `--warmup 4 --lr-schedule cosine --min-lr "
                      f"3e-4 --steps {steps}` (ZeRO 2, CPU optimizer)", "",
                      f"Emitted: `{json.dumps(sch)}`.", "",
                      "| step | " + " | ".join(str(k + 1) for k in range(steps))
                      + " |", "|---|" + "---|" * steps,
                      "| stowage lr | " + " | ".join(f"{x:.4g}" for x in slr) + " |",
                      "| DeepSpeed lr | " + " | ".join(f"{x:.4g}" for x in ds["lrs"])
                      + " |", "",
                      f"Steps whose lr differs: {differ} ({len(differ)}); the --emit "
                      f"note said {noted}; from step 5 (after the warmup) the same: "
                      f"{'yes' if after else 'NO'}. {'ok' if ok else 'MISMATCH'}.", "",
                      ]
    else:
        lines = ["# The emitted Megatron-LM arguments against stowage train "
                 f"({host}, {now:%Y-%m-%dT%H:%MZ})", "",
                 f"stowage {rev} (`{stowage}`); torch {torch.__version__}, "
                 f"Python {sys.version.split()[0]}; {os.cpu_count()} CPUs. "
                 f"Model and data as the DeepSpeed run's (bench/"
                 f"engine-check.py): the small LLaMA, `init-model --seed 3`, "
                 f"20000 random tokens.", ""]
    if a.only != "deepspeed":
        mlines, mfailed = megatron_check(stowage, work, model, shard)
        lines += mlines
        failed += mfailed
    lines += [
        "## Not run", "",
        "Megatron-LM's training: the trainer that reads the flags stowage "
        "emits (pretrain_gpt.py, megatron/training/) is not on PyPI, the "
        "only index this machine reaches: the megatron-core wheel (0.16.1 "
        "for this Python) holds megatron/core alone; and it does not run "
        "on a CPU (megatron/training/training.py get_model moves the "
        "model to torch.cuda.current_device() and pretrain_gpt.py moves "
        "each batch with .cuda()). "
        "What runs here is megatron-core's own scheduler over the emitted "
        "flags (above, with --only megatron or both); the transcription of "
        "it in tests/test-cli-emit.c (/cli-emit/optim-megatron) keeps the "
        "suite honest without the venv.",
        "torchtitan: stowage emits no torchtitan config (its --recompute "
        "selective-op is carried by --emit plan only), so there is nothing "
        "of stowage's to run there.", ""]
    lines.append(f"Result: {'all within tolerance' if not failed else f'{failed} case(s) out of tolerance'}.")
    benchlib.report("engine-check-bf16" if bf16 else "engine-check", host, now, lines, save=not a.no_save)
    subprocess.run(["rm", "-rf", work])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
