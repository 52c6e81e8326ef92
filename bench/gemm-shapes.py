#!/usr/bin/python3
# SPDX-License-Identifier: MIT
#
# bench/gemm-shapes.py: the GEMMs of bench/cpu-train.py's training step,
# shape by shape, as the cpu runtime runs them (bench/sgemm-shapes: tiles
# of C, each a single-threaded call of the kernel executor/gemm.c chose)
# and as PyTorch's torch.mm runs them (MKL for fp32, oneDNN on AMX for
# bf16), each with its operands in the caches (the same call repeated) and
# out of them (a 256 MiB buffer written before each call, as a step's
# other kernels evict a product's operands), set against the machine's
# peak on 4096^3 (the best of the two).  Where the step's GEMM rate stands
# against the peak: how much is the kernel and how much the data coming
# from memory.  Rounds alternate the two; the best call of each.
#
#   bench/gemm-shapes.py [--build build] [--threads 2] [--rounds 2]
#       [--peer-python bench/venv-torch/bin/python] [--no-save]

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
from benchlib import report, stamp  # noqa: E402

ROOT = os.path.dirname(HERE)

# (transposes, M, N, K, calls a step) of the bench model (hidden 768, FFN
# 2048, vocabulary 32,000, 512 tokens, 12 layers; the loss in two chunks
# of 262 and 250 tokens, the larger here): C = op(A) op(B).
SHAPES = [
    ("NT", 512, 768, 768, 48),     # q, k, v, o
    ("NT", 512, 2048, 768, 24),    # gate, up
    ("NT", 512, 768, 2048, 12),    # down
    ("NN", 512, 768, 768, 48),     # dX of q, k, v, o
    ("NN", 512, 768, 2048, 24),    # dX of gate, up
    ("NN", 512, 2048, 768, 12),    # dX of down
    ("TN", 768, 768, 512, 48),     # dW of q, k, v, o
    ("TN", 2048, 768, 512, 24),    # dW of gate, up
    ("TN", 768, 2048, 512, 12),    # dW of down
    ("NT", 262, 32000, 768, 2),    # logits
    ("NN", 262, 768, 32000, 2),    # dxn
    ("TN", 32000, 768, 262, 2),    # the head's gradient
]
FLUSH_MIB = 256


def torch_worker(a):
    import torch
    torch.set_num_threads(a.threads)
    sweep = torch.empty(FLUSH_MIB << 18, dtype=torch.float32)
    out = {}
    for prec, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for t, m, n, k, _ in SHAPES + [("NN", 4096, 4096, 4096, 0)]:
            x = torch.randn(k, m) if t[0] == "T" else torch.randn(m, k)
            y = torch.randn(n, k) if t[1] == "T" else torch.randn(k, n)
            x, y = x.to(dt), y.to(dt)
            x = x.t() if t[0] == "T" else x
            y = y.t() if t[1] == "T" else y
            torch.mm(x, y)
            reps = 4 if m == 4096 else a.reps
            for cold in (False, True):
                best = 1e30
                for r in range(reps):
                    if cold:
                        sweep.fill_(r)
                    t0 = time.perf_counter()
                    torch.mm(x, y)
                    best = min(best, time.perf_counter() - t0)
                key = "%s %s:%dx%dx%d %s" % (prec, t, m, n, k,
                                             "cold" if cold else "warm")
                out[key] = 2.0 * m * n * k / best / 1e9
    print(json.dumps(dict(gflops=out, version=torch.__version__)))


def runtime(a, env):
    exe = os.path.join(a.build, "bench", "sgemm-shapes")
    specs = ["%s:%dx%dx%d" % (t, m, n, k) for t, m, n, k, _ in SHAPES]
    out, kernel = {}, ""
    for prec, extra in (("fp32", []), ("bf16", ["--bf16"])):
        for cold in (False, True):
            fl = ["--flush", str(FLUSH_MIB)] if cold else []
            r = subprocess.run([exe, "--threads", str(a.threads), "--reps",
                                str(a.reps)] + fl + extra + specs,
                               check=True, capture_output=True, text=True,
                               env=env)
            d = json.loads(r.stdout)
            kernel = d["kernel"]
            for s, g in zip(specs, d["gflops"]):
                out["%s %s %s" % (prec, s, "cold" if cold else "warm")] = g
        r = subprocess.run([exe, "--threads", str(a.threads)] + extra
                           + ["4096x4096x4096"], check=True,
                           capture_output=True, text=True, env=env)
        out["%s NN:4096x4096x4096 warm" % prec] = json.loads(
            r.stdout)["gflops"][0]
    return out, kernel


def best_of(runs):
    keys = runs[0].keys()
    return {k: max(r[k] for r in runs if k in r) for k in keys}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--peer-python",
                    default=os.path.join(HERE, "venv-torch", "bin", "python"),
                    help="the python of PyTorch from PyPI "
                    "(bench/cpu-torch-venv.sh)")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return torch_worker(a)
    host, now = stamp()
    # Passive waits: a waiting thread sleeps (as bench/cpu-train.py runs).
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads),
               OMP_WAIT_POLICY="passive")
    load = open("/proc/loadavg").read().split()[:3]
    ours, theirs, version, kernel = [], [], "", ""
    for _ in range(a.rounds):
        o, kernel = runtime(a, env)
        ours.append(o)
        r = subprocess.run([a.peer_python, os.path.abspath(__file__),
                            "--worker", "--threads", str(a.threads),
                            "--reps", str(a.reps)],
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit("%s --worker failed:\n%s" % (a.peer_python,
                                                   r.stderr[-3000:]))
        d = json.loads(r.stdout.splitlines()[-1])
        theirs.append(d["gflops"])
        version = d["version"]
    o, t = best_of(ours), best_of(theirs)
    lines = [
        "# The training step's GEMMs, shape by shape: %s" % now.strftime(
            "%Y-%m-%dT%H:%MZ"),
        "",
        "Host: %d cores, %s; load average at the start: %s." % (
            os.cpu_count(), open("/proc/cpuinfo").read().split(
                "model name")[1].split("\n")[0].strip(" :\t"),
            " ".join(load)),
        "The runtime: %s. PyTorch %s (`torch.mm`). %d threads, "
        "OMP_WAIT_POLICY=passive; the best of %d calls in each of %d "
        "rounds; cold: a %d MiB buffer written before each call." % (
            kernel, version, a.threads, a.reps, a.rounds, FLUSH_MIB),
        "",
    ]
    for prec in ("fp32", "bf16"):
        big = "%s NN:4096x4096x4096 warm" % prec
        peak = max(o[big], t[big])
        lines += [
            "## %s: the peak on 4096^3 %.0f GFLOP/s (runtime %.0f, torch.mm "
            "%.0f)" % (prec, peak, o[big], t[big]),
            "",
            "| product | calls a step | runtime warm | runtime cold | "
            "torch.mm warm | torch.mm cold | runtime / torch.mm, cold | "
            "runtime cold / peak | torch.mm cold / peak |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        tot = {"ours": 0.0, "theirs": 0.0, "flop": 0.0}
        for tr, m, n, k, calls in SHAPES:
            key = "%s %s:%dx%dx%d" % (prec, tr, m, n, k)
            ow, oc = o[key + " warm"], o[key + " cold"]
            tw, tc = t[key + " warm"], t[key + " cold"]
            flop = 2.0 * m * n * k * calls
            tot["flop"] += flop
            tot["ours"] += flop / (oc * 1e9)
            tot["theirs"] += flop / (tc * 1e9)
            lines.append(
                "| %s %dx%dx%d | %d | %.0f | %.0f | %.0f | %.0f | %.2f | "
                "%.2f | %.2f |" % (tr, m, n, k, calls, ow, oc, tw, tc,
                                   oc / tc, oc / peak, tc / peak))
        ro = tot["flop"] / tot["ours"] / 1e9
        rt = tot["flop"] / tot["theirs"] / 1e9
        lines += [
            "| the step's mix (by its calls) | | | %.0f | | %.0f | %.2f | "
            "%.2f | %.2f |" % (ro, rt, ro / rt, ro / peak, rt / peak),
            "",
        ]
    lines += ["Command: `bench/gemm-shapes.py %s`." % " ".join(sys.argv[1:])]
    report("gemm-shapes", host, now, lines, save=not a.no_save)


if __name__ == "__main__":
    main()
