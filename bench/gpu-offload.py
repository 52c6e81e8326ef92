#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
#
# bench/gpu-offload.py: ZeRO-Offload on the GPU (`stowage train --backend
# cuda --offload-optimizer cpu`) against its bound, issue 22: the step
# time over max(GPU compute, PCIe down, PCIe up, CPU Adam) of the same
# step (goal <= 1.1x), also with ZeRO-Offload's one-step delayed update
# (--delayed-update), each stream's busy time as measured beside the
# simulated one (--stream-times), and the run that keeps its optimizer on
# the GPU beside it, with whether the two give the same weights (sha256
# of model.safetensors).  The model and tokens are bench/gpu-train.py's,
# with untied embeddings: the executor's gradient slots, which the
# offloaded optimizer takes, do not run tied ones yet (executor/backends/
# tensors.c says so).
#
# On the GPU machine (bench/gpu.sh offload runs it):
#   python3 bench/gpu-offload.py --stowage PATH/TO/stowage --out DIR
# Writes DIR/gpu-offload.md and prints it.

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "gpu_train", os.path.join(HERE, "gpu-train.py"))
gpu_train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_train)


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    gpu_train.add_model_args(ap)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=0,
                    help="stowage train --threads (0: its default)")
    ap.set_defaults(steps=5, untied=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="stow-gpu-offload-")
    model, shard, _ = gpu_train.make_model(a, tmp)
    rows = {}
    cmds = {}
    failed = {}
    for name, extra in (("optimizer on the GPU", []),
                        ("optimizer in host memory",
                         ["--offload-optimizer", "cpu"]),
                        ("optimizer in host memory, delayed update",
                         ["--offload-optimizer", "cpu", "--delayed-update"])):
        out = os.path.join(tmp, "out-%d" % len(cmds))
        log = os.path.join(tmp, "log-%d.jsonl" % len(cmds))
        cmd = [a.stowage, "train", "--backend", "cuda", "--model", model,
               "--data", shard, "--steps", str(a.steps), "--seq", str(a.seq),
               "--micro-batch", str(a.batch), "--lr", "1e-4", "--precision",
               a.precision, "--out", out, "--log-json", log,
               "--stream-times"] + extra
        if a.threads:
            cmd += ["--threads", str(a.threads)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(r.stderr)
        cmds[name] = " ".join(os.path.basename(c) if c == a.stowage else c
                              for c in cmd)
        if r.returncode != 0:
            # The other runs are still worth their rows.
            failed[name] = r.stderr.strip().splitlines()[-1:] or ["?"]
            continue
        with open(log) as f:
            steps = [json.loads(line) for line in f]
        ckpt = os.path.join(out, "step-%06d" % a.steps, "model.safetensors")
        rows[name] = dict(times=[s["step_time_s"] for s in steps][2:],
                          streams=steps[-1].get("streams", {}),
                          last=steps[-1]["step_time_s"], sha=sha(ckpt),
                          loss=steps[-1]["loss"])
    tokens = a.batch * a.seq
    lines = ["# ZeRO-Offload on the GPU: stowage train --backend cuda "
             "--offload-optimizer cpu against its bound (%s)"
             % torch.cuda.get_device_name(), "",
             "Model: LLaMA h %d, %d layers, f %d, V %d, untied; seq %d, "
             "micro-batch %d, %s; %d steps, the first two dropped; %d host "
             "cores." % (a.hidden, a.layers, a.ffn, a.vocab, a.seq, a.batch,
                         a.precision, a.steps, os.cpu_count()), "",
             "Commands (in a scratch directory):", "", "```"]
    lines += list(cmds.values()) + ["```", ""]
    lines += ["| run | step median (s) | tokens/s | final loss | "
              "model.safetensors sha256 |", "|---|---:|---:|---:|---|"]
    for n, r in rows.items():
        m = statistics.median(r["times"])
        lines.append("| %s | %.4f | %.0f | %.4f | %s… |" % (
            n, m, tokens / m, r["loss"], r["sha"][:12]))
    for n, why in failed.items():
        lines.append("| %s | failed: %s | | | |" % (n, why[0]))
    plain = [r["sha"] for n, r in rows.items() if "delayed" not in n]
    # Both runs without the delayed update must have finished to compare.
    verdict = ("not compared: a run failed" if len(plain) < 2
               else "the same bytes" if len(set(plain)) == 1 else "DIFFERENT")
    lines += ["", "Weights of the runs without the delayed update (whose "
              "updates lag a step and are not clipped): %s." % verdict, ""]
    for n, r in rows.items():
        st = r["streams"]
        lines += ["%s, last step (%.4f s), busy / exposed seconds per "
                  "stream:" % (n, r["last"]), "",
                  "| stream | busy | exposed | simulated busy | measured / "
                  "simulated |", "|---|---:|---:|---:|---:|"]
        for s, v in st.items():
            sim = v.get("simulated_busy_s", 0)
            lines.append("| %s | %.4f | %.4f | %.4f | %s |" % (
                s, v["busy_s"], v["exposed_s"], sim,
                "%.2f" % (v["busy_s"] / sim) if sim > 0 else "n/a"))
        bound = max([v["busy_s"] for s, v in st.items()
                     if s in ("compute", "h2d", "d2h", "cpu_optim")] or [0])
        if bound > 0:
            lines += ["", "Step / max(compute, h2d, d2h, cpu_optim busy): "
                      "%.4f / %.4f = **%.3f** (goal <= 1.1)." % (
                          r["last"], bound, r["last"] / bound)]
        lines.append("")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "gpu-offload.md"), "w") as f:
        f.write(text)
    shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        raise SystemExit("stowage train failed: %s" % ", ".join(failed))


if __name__ == "__main__":
    main()
