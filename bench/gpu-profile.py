#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
#
# bench/gpu-profile.py: where a training step's GPU time goes, kernel by
# kernel, in `stowage train --backend cuda` (Nsight Compute, one metric:
# gpu__time_duration, clocks left alone) and in bench/gpu-train.py's
# PyTorch eager step (torch.profiler), on the same LLaMA with fewer layers
# so the profiled run stays short.  Each side's kernels are grouped by
# name, with their time per step and share; the totals say how much of
# the tokens/s gap of bench/gpu-train.py is kernels rather than launches.
#
#   python3 bench/gpu-profile.py --stowage PATH/TO/stowage --out DIR
#       [--layers 2] [--steps 2]
# Writes DIR/gpu-profile.md and prints it.

import argparse
import csv
import glob
import importlib.util
import io
import os
import shutil
import subprocess
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "gpu_train", os.path.join(HERE, "gpu-train.py"))
gpu_train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_train)


def ncu_path():
    p = shutil.which("ncu")
    if p:
        return p
    c = sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu")
               + glob.glob("/usr/local/cuda*/bin/ncu"))
    return c[-1] if c else None


def table(title, kernels, steps, top=30):
    total = sum(t for t, _ in kernels.values())
    lines = ["## %s: %.2f ms of kernels per step, %d launches per step" % (
        title, total / steps * 1e3, sum(n for _, n in kernels.values())
        // steps), "", "| kernel | ms/step | launches/step | share |",
        "|---|---:|---:|---:|"]
    for k, (t, n) in sorted(kernels.items(), key=lambda x: -x[1][0])[:top]:
        lines.append("| `%s` | %.3f | %d | %.1f%% |" % (
            k[:90].replace("|", "/"), t / steps * 1e3, n // steps,
            100 * t / total if total else 0))
    return lines + [""]


def main():
    ap = argparse.ArgumentParser()
    gpu_train.add_model_args(ap)
    ap.add_argument("--out", required=True)
    ap.set_defaults(layers=2, steps=2)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="stow-gpu-profile-")
    model, shard, toks = gpu_train.make_model(a, tmp)
    lines = ["# Kernel time per training step: stowage train --backend cuda "
             "against PyTorch eager (%s)" % torch.cuda.get_device_name(), "",
             "LLaMA h %d, %d layers, %d heads, f %d, V %d, tied; seq %d, "
             "micro-batch %d, %s; %d steps profiled, times per step." % (
                 a.hidden, a.layers, a.heads, a.ffn, a.vocab, a.seq, a.batch,
                 a.precision, a.steps), ""]
    ncu = ncu_path()
    cmd = [a.stowage, "train", "--backend", "cuda", "--model", model,
           "--data", shard, "--steps", str(a.steps), "--seq", str(a.seq),
           "--micro-batch", str(a.batch), "--lr", "1e-4", "--precision",
           a.precision, "--out", os.path.join(tmp, "out")]
    if ncu is None:
        lines += ["ncu: not found; no stowage kernel table.", ""]
    else:
        r = subprocess.run([ncu, "--clock-control", "none", "--metrics",
                            "gpu__time_duration.sum", "--csv",
                            "--print-units", "base"] + cmd,
                           capture_output=True, text=True)
        body = r.stdout[r.stdout.find('"ID"'):]
        kernels = {}
        for row in csv.DictReader(io.StringIO(body)):
            if row.get("Metric Name") != "gpu__time_duration.sum":
                continue
            name = row["Kernel Name"]
            t = float(row["Metric Value"].replace(",", "")) * 1e-9
            old = kernels.get(name, (0.0, 0))
            kernels[name] = (old[0] + t, old[1] + 1)
        if not kernels:
            lines += ["ncu gave no rows (exit %d): %s" % (
                r.returncode, (r.stderr or r.stdout)[-2000:]), ""]
        else:
            lines += table("stowage", kernels, a.steps)
    from torch.profiler import profile, ProfilerActivity
    kernels = {}
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            gpu_train.torch_steps(a, model, toks)
        for e in prof.events():
            # Loading the weights (pageable copies up) is not the step's.
            if e.device_type != torch.autograd.DeviceType.CUDA \
                    or e.name.startswith("Memcpy HtoD (Pageable"):
                continue
            old = kernels.get(e.name, (0.0, 0))
            kernels[e.name] = (old[0] + e.time_range.elapsed_us() * 1e-6,
                               old[1] + 1)
    except Exception as e:  # the stowage table is still worth keeping
        lines += ["torch.profiler failed: %r" % e, ""]
    lines += table("PyTorch eager", kernels, a.steps)
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "gpu-profile.md"), "w") as f:
        f.write(text)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
