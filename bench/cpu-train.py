#!/usr/bin/python3
# SPDX-License-Identifier: MIT
#
# bench/cpu-train.py: training tokens/s of `stowage train` (the cpu backend)
# against PyTorch on the same ~110M-parameter LLaMA (h 768, 12 layers of 12
# heads, f 2048, V 32000, tied), the same initial weights, tokens, batch,
# threads and optimizer (AdamW, clipping at 1.0): stowage in fp32 and
# --precision bf16; PyTorch from PyPI (a venv, bench/cpu-torch-venv.sh)
# eager, torch.compile and eager under bf16 autocast; Debian's torch eager.
# The torch step is the layer of bench/llama-layer.py (HF's modeling_llama
# math written out) stacked, with the embedding, the final norm and the
# tied head, autograd and torch.optim.AdamW, each system in its own process.
# The systems take turns, --rounds runs of --steps each; the first --warmup
# steps of each run are dropped (torch.compile compiles in them), and the
# median of the kept steps is compared.  Inside stowage's steps, every
# kernel call is timed (STOWAGE_KERNEL_TIMES, bench/kernel-times.py): the
# GEMMs' GFLOP/s as they ran in the step, against the machine's peak (the
# best of PyTorch's torch.mm and the runtime's own GEMM on 4096^3, fp32 and
# bf16), and what the step spends outside them.
# Results go to bench/results/cpu-train-<host>-<date>.md, naming the CPU,
# its flags, the kernels and each torch's BLAS.
#
# Run with Debian's python (python3-torch) after building:
#   bench/cpu-torch-venv.sh
#   /usr/bin/python3 bench/cpu-train.py --build build --threads 2 \
#     --peer-python bench/venv-torch/bin/python

import argparse
import json
import os
import platform
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
from benchlib import read_safetensors, report, stamp  # noqa: E402


def load_module(name, file):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(HERE, file))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


kernel_times = load_module("kernel_times", "kernel-times.py")

ROOT = os.path.dirname(HERE)
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
# The options that shape the model and the batch (the command line of a
# result names those that differ from the defaults).
MODEL = ("seq", "batch", "hidden", "layers", "heads", "ffn", "vocab")


def load_layer():
    return load_module("llama_layer", "llama-layer.py")


def torch_worker(a):
    """One run of PyTorch (--worker eager|compile|autocast) on the model
    and tokens the parent wrote; prints its step times and losses."""
    import torch
    torch.set_num_threads(a.threads)
    if a.worker == "peak":
        return torch_peak(a)
    ll = load_layer()
    hf = read_safetensors(os.path.join(a.model_dir, "model.safetensors"))
    with open(a.tokens, "rb") as f:
        toks = torch.tensor(list(struct.unpack(
            "<%dH" % (os.path.getsize(a.tokens) // 2), f.read())),
            dtype=torch.long)
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

    def loss_of(x_ids, y):
        x = emb[x_ids]
        for p in layers:
            x = ll.layer(p, cos, sin, x, a.heads, a.heads)
        logits = torch.nn.functional.linear(ll.rms_norm(x, norm), emb)
        return torch.nn.functional.cross_entropy(
            logits.view(B * T, -1).float(), y.reshape(-1))

    fwd = torch.compile(loss_of) if a.worker == "compile" else loss_of
    times, cpus, losses = [], [], []
    for step in range(a.steps):
        i = step * B * T
        x_ids = toks[i:i + B * T].reshape(B, T)
        y = toks[i + 1:i + B * T + 1].reshape(B, T)
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16,
                            enabled=a.worker == "autocast"):
            loss = fwd(x_ids, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    cfg = torch.__config__.show()
    blas = [ln.strip(" -") for ln in cfg.splitlines()
            if "Math Kernel" in ln or "MKL-DNN" in ln or "oneDNN" in ln
            or "OpenBLAS" in ln or "BLAS_INFO" in ln]
    print(json.dumps(dict(times=times, losses=losses,
                          cpu=statistics.mean(cpus[a.warmup:]),
                          version=torch.__version__,
                          blas="; ".join(b.split(",")[0] for b in blas),
                          isa=torch.backends.cpu.get_cpu_capability()
                          if hasattr(torch.backends, "cpu") else "")))


def torch_peak(a):
    """PyTorch's torch.mm on 4096^3 in fp32 and bf16 (MKL, oneDNN on
    AMX), best of 5 calls after one, by wall time and by the process's CPU
    time over the threads: the machine's GEMM peak as the best library
    there reaches it."""
    import torch
    n, out = 4096, {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x = torch.randn(n, n).to(dt)
        y = torch.randn(n, n).to(dt)
        torch.mm(x, y)
        walls, cpus = [], []
        for _ in range(5):
            t0, c0 = time.perf_counter(), time.process_time()
            torch.mm(x, y)
            walls.append(time.perf_counter() - t0)
            cpus.append((time.process_time() - c0) / a.threads)
        out[name] = 2.0 * n ** 3 / min(walls) / 1e9
        out[name + " cpu"] = 2.0 * n ** 3 / min(cpus) / 1e9
    print(json.dumps(dict(gflops=out, version=torch.__version__)))


def runtime_peak(a, env):
    """The runtime's own GEMM (bench/sgemm-shapes) on 4096^3, fp32 and
    bf16: GFLOP/s by wall time and by CPU time over the threads."""
    exe = os.path.join(a.build, "bench", "sgemm-shapes")
    out, n = {}, 4096
    for name, extra in (("fp32", []), ("bf16", ["--bf16"])):
        r = subprocess.run([exe, "--threads", str(a.threads)] + extra
                           + ["%dx%dx%d" % (n, n, n)], check=True,
                           capture_output=True, text=True, env=env)
        d = json.loads(r.stdout)
        out[name] = d["gflops"][0]
        out[name + " cpu"] = 2.0 * n ** 3 / d["cpu_seconds"][0] / 1e9
    return out


def torch_run_peak(a, env):
    r = subprocess.run([a.peer_python, os.path.abspath(__file__),
                        "--worker", "peak", "--threads", str(a.threads)],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit("%s --worker peak failed:\n%s" % (a.peer_python,
                                                    r.stderr[-3000:]))
    return json.loads(r.stdout.splitlines()[-1])["gflops"]


def peaks(a, env):
    """{"fp32", "bf16", "fp32 cpu", "bf16 cpu"}: the best of PyTorch's and
    the runtime's GFLOP/s, and each one's."""
    t = torch_run_peak(a, env)
    r = runtime_peak(a, env)
    return {k: max(t[k], r[k]) for k in t}, t, r


def cpu_info():
    model, flags = platform.processor(), set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return model, [x for x in FLAGS if x in flags]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1,
                    help="steps of each run left out of the times")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--peer-python",
                    default=os.path.join(HERE, "venv-torch", "bin", "python"),
                    help="the python of PyTorch from PyPI "
                    "(bench/cpu-torch-venv.sh)")
    ap.add_argument("--debian-python", default="/usr/bin/python3",
                    help="Debian's python3-torch; '' to leave it out")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--worker",
                    choices=("eager", "compile", "autocast", "peak"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return torch_worker(a)
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
    import random
    rng = random.Random(2)
    n_tok = a.batch * a.seq * a.steps + 1
    toks = [rng.randrange(a.vocab) for _ in range(n_tok)]
    raw = struct.pack("<%dH" % n_tok, *toks)
    shard = os.path.join(tmp, "train.bin")
    with open(shard, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n_tok, *([0] * 253)))
        f.write(raw)
    tok_file = os.path.join(tmp, "tokens.u16")
    with open(tok_file, "wb") as f:
        f.write(raw)
    # Passive: a thread that waits sleeps, so that the CPU time is the work
    # (and a waiting thread takes no core from a loaded machine's others).
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads),
               OMP_WAIT_POLICY="passive",
               STOWAGE_KERNEL_TIMES=os.path.join(tmp, "kernel-times.jsonl"))
    log, out = os.path.join(tmp, "log.jsonl"), os.path.join(tmp, "out")

    def stowage_cpu(cmd):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(cmd, check=True, capture_output=True, text=True,
                       env=env)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime

    kt = os.path.join(tmp, "kernel-times.jsonl")

    def stowage_run(extra, steps=None):
        cmd = [stowage, "train", "--model", model, "--data", shard,
               "--steps", str(steps or a.steps), "--seq", str(a.seq),
               "--micro-batch", str(a.batch), "--lr", "1e-4",
               "--threads", str(a.threads), "--out", out, "--log-json",
               log] + extra
        subprocess.run(["rm", "-rf", out, kt])
        cpu = stowage_cpu(cmd)
        with open(log) as f:
            rows = [json.loads(line) for line in f]
        if steps:
            return cpu
        times = [r["step_time_s"] for r in rows]
        header, parts = kernel_times.parts(kt, times)
        # The CPU time of the kept steps: this run's less that of a run of
        # the warm-up steps alone (loading, the first steps, saving).
        subprocess.run(["rm", "-rf", out])
        base = stowage_run(extra, a.warmup)
        return dict(times=times, losses=[r["loss"] for r in rows],
                    cpu=(cpu - base) / (a.steps - a.warmup),
                    dtype=header["dtype"], gemm=header["gemm"],
                    parts=parts[a.warmup:])

    def torch_run(python, mode):
        cmd = [python, os.path.abspath(__file__), "--worker", mode,
               "--model-dir", model, "--tokens", tok_file]
        for k in ("threads", "steps", "seq", "batch", "hidden", "layers",
                  "heads", "ffn", "vocab"):
            cmd += ["--" + k, str(getattr(a, k))]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit("%s --worker %s failed:\n%s" % (python, mode,
                                                     r.stderr[-3000:]))
        return json.loads(r.stdout.splitlines()[-1])

    systems = [
        # --precision always: the command's default is bf16.
        ("stowage train, fp32",
         lambda: stowage_run(["--precision", "fp32"])),
        ("stowage train --precision bf16",
         lambda: stowage_run(["--precision", "bf16"])),
        ("PyTorch eager, fp32", lambda: torch_run(a.peer_python, "eager")),
        ("PyTorch torch.compile, fp32",
         lambda: torch_run(a.peer_python, "compile")),
        ("PyTorch eager, bf16 autocast",
         lambda: torch_run(a.peer_python, "autocast")),
    ]
    if a.debian_python:
        systems.append(("Debian's PyTorch eager, fp32",
                        lambda: torch_run(a.debian_python, "eager")))
    runs = {name: [] for name, _ in systems}
    load0 = os.getloadavg()[0]
    peak0 = peaks(a, env)
    for rnd in range(a.rounds):
        # Alternate the order too: no system always follows the same one.
        order = systems if rnd % 2 == 0 else systems[::-1]
        for name, fn in order:
            runs[name].append(fn())
            print("round %d: %s %s" % (rnd + 1, name, " ".join(
                "%.3f" % t for t in runs[name][-1]["times"])),
                file=sys.stderr, flush=True)
    load1 = os.getloadavg()[0]
    # What each of stowage's rows ran as (the runtime's header): the
    # command's default precision is bf16, and a row must not say fp32
    # over a bf16 run.
    for name, want in (("stowage train, fp32", "fp32"),
                       ("stowage train --precision bf16", "bf16")):
        got = {r["dtype"] for r in runs[name]}
        if got != {want}:
            sys.exit("%s ran as %s" % (name, ", ".join(sorted(got))))
    med = {n: statistics.median(t for r in rs for t in r["times"][a.warmup:])
           for n, rs in runs.items()}
    # The CPU seconds of a step over the threads: the step on a machine
    # nothing else loads, were the threads always balanced.
    cpu = {n: statistics.median(r["cpu"] for r in rs) / a.threads
           for n, rs in runs.items()}
    # The machine's GEMM peak, before and after the runs: the better of
    # the two moments.
    p1, p2 = peak0, peaks(a, env)
    peak = {k: max(p1[0][k], p2[0][k]) for k in p1[0]}
    tpeak = {k: max(p1[1][k], p2[1][k]) for k in p1[1]}
    rpeak = {k: max(p1[2][k], p2[2][k]) for k in p1[2]}
    inside = {n: kernel_times.median([p for r in rs for p in r["parts"]])
              for n, rs in runs.items() if "parts" in rs[0]}
    kernel = runs["stowage train, fp32"][0]["gemm"]
    tokens = a.batch * a.seq
    params = sum(x.numel() for x in read_safetensors(
        os.path.join(model, "model.safetensors")).values())
    cpu_model, flags = cpu_info()
    host, now = stamp()
    peer = runs["PyTorch eager, fp32"][0]
    deb = runs.get("Debian's PyTorch eager, fp32", [None])[0]
    s32, s16 = med["stowage train, fp32"], med["stowage train --precision bf16"]
    lines = [
        "# Training tokens/s: stowage train (cpu backend) vs PyTorch "
        "(%s, %s UTC)" % (host, now.strftime("%Y-%m-%d %H:%M")), "",
        "CPU: %s, %d threads; flags: %s." % (cpu_model, a.threads, " ".join(flags)),
        "stowage's GEMM kernel (executor/gemm.c): %s." % kernel,
        "PyTorch from PyPI: torch %s (%s; CPU capability %s)." % (
            peer["version"], peer["blas"], peer["isa"]),
    ]
    if deb:
        lines.append("Debian's: torch %s (%s)." % (deb["version"],
                                                  deb["blas"]))
    lines += [
        "", "Model: LLaMA h %d, %d layers, %d heads, f %d, V %d, tied: %s "
        "parameters; seq %d, micro-batch %d, AdamW with clipping; "
        "%d rounds of the systems in turn, %d steps each, the first %d of "
        "each run dropped; the median of the rest." % (
            a.hidden, a.layers, a.heads, a.ffn, a.vocab, f"{params:,}", a.seq,
            a.batch, a.rounds, a.steps, a.warmup),
        "The machine's 1-minute load average: %.1f at the start, %.1f at "
        "the end (other work on a shared machine slows the runs that meet "
        "it: the median, and the turns, are against that)." % (load0, load1),
        "",
        "| system | step median (s) | step best (s) | tokens/s (median) "
        "| CPU s / step / thread | first loss |",
        "|---|---:|---:|---:|---:|---:|"]
    for name, rs in runs.items():
        kept = [t for r in rs for t in r["times"][a.warmup:]]
        lines.append("| %s | %.3f | %.3f | %.0f | %.3f | %.4f |" % (
            name, med[name], min(kept), tokens / med[name], cpu[name],
            rs[0]["losses"][0]))
    ratio = [("fp32", "PyTorch eager, fp32", s32),
             ("fp32", "PyTorch torch.compile, fp32", s32),
             ("bf16", "PyTorch eager, bf16 autocast", s16)]
    if deb:
        ratio.append(("fp32", "Debian's PyTorch eager, fp32", s32))
    c32 = cpu["stowage train, fp32"]
    c16 = cpu["stowage train --precision bf16"]
    lines += ["", "stowage / peer tokens/s (above 1: stowage is faster), from "
              "the median steps and from the CPU seconds per step:", ""]
    for prec, peer_name, s in ratio:
        c = c32 if prec == "fp32" else c16
        lines.append("- %s: %.2fx (CPU time %.2fx) %s" % (
            prec, med[peer_name] / s, cpu[peer_name] / c, peer_name))
    lines += [
        "", "The machine's GEMM peak on 4096^3 (best of 5 calls, %d threads, "
        "before and after the runs), by wall time and by CPU time over the "
        "threads (what the calls take on cores of their own): fp32 %.0f and "
        "%.0f GFLOP/s (PyTorch's torch.mm %.0f and %.0f, the runtime's %.0f "
        "and %.0f), bf16 %.0f and %.0f GFLOP/s (PyTorch %.0f and %.0f, the "
        "runtime %.0f and %.0f)." % (
            a.threads, peak["fp32"], peak["fp32 cpu"], tpeak["fp32"],
            tpeak["fp32 cpu"], rpeak["fp32"], rpeak["fp32 cpu"],
            peak["bf16"], peak["bf16 cpu"], tpeak["bf16"], tpeak["bf16 cpu"],
            rpeak["bf16"], rpeak["bf16 cpu"])]
    for name, prec in (("stowage train, fp32", "fp32"),
                       ("stowage train --precision bf16", "bf16")):
        m = inside[name]
        rate = m["gemm_flops"] / m["gemm"] / 1e9
        rate_cpu = m["gemm_flops"] / m["gemm_cpu"] / 1e9
        c = cpu[name]
        lines += [
            "", "Inside the steps of %s (every kernel call timed, "
            "STOWAGE_KERNEL_TIMES; the median of each part over the kept "
            "steps of every round): the GEMMs (%.1f GFLOP a step) at %.0f "
            "GFLOP/s by wall time, %.2f of the %s peak, and %.0f GFLOP/s by "
            "CPU time, %.2f of its peak; outside the GEMMs %.3f s, %.0f%% of "
            "the step's wall time, and %.3f s, %.0f%% of its CPU time per "
            "thread (%.3f s)." % (
                name, m["gemm_flops"] / 1e9, rate, rate / peak[prec], prec,
                rate_cpu, rate_cpu / peak[prec + " cpu"],
                m["step"] - m["gemm"],
                100 * (m["step"] - m["gemm"]) / m["step"],
                c - m["gemm_cpu"], 100 * (c - m["gemm_cpu"]) / c, c), ""]
        lines += kernel_times.table(m)
    lines += [
        "", "Command:", "",
        "    /usr/bin/python3 bench/cpu-train.py --build %s --threads %d "
        "--steps %d --rounds %d --warmup %d --peer-python %s%s" % (
            os.path.relpath(a.build, ROOT) if a.build.startswith(ROOT)
            else a.build, a.threads, a.steps, a.rounds,
            a.warmup,
            os.path.relpath(a.peer_python, ROOT)
            if a.peer_python.startswith(ROOT) else a.peer_python,
            "".join(" --%s %s" % (k, getattr(a, k)) for k in MODEL
                    if getattr(a, k) != ap.get_default(k))), ""]
    report("cpu-train", host, now, lines, save=not a.no_save)
    subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
