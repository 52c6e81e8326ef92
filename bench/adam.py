#!/usr/bin/python3
# SPDX-License-Identifier: MIT
#
# bench/adam.py: CPU Adam against its physical limit and its peer, side by
# side in one run: `stowage bench memcpy` (STREAM triad, same threads and
# binding), `stowage bench adam`, and PyTorch's CPU AdamW (for-loop and
# foreach; fused where this torch has it on CPU) on the same thread count and
# parameter count.  Repeats the set several times, because the machine may be
# shared, and writes bench/results/adam-<host>-<date>.{json,md} with the best,
# the spread, the ratios and the exact commands.
#
# Run with Debian's python (/usr/bin/python3, python3-torch) after building:
#   /usr/bin/python3 bench/adam.py --threads 2 --params 64M --runs 5

import argparse
import datetime
import inspect
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse_count(text):
    mult = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9}
    t = text.strip().upper()
    if t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    return int(t)


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:
        return ""


def torch_adamw(torch, n, threads, variant, reps):
    """Best and all step times of torch.optim.AdamW on one flat fp32 tensor
    of n parameters with fp32 gradients (torch's CPU AdamW needs grads of
    the parameter's dtype)."""
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(1)
    p = torch.nn.Parameter(torch.rand(n, generator=g) * 2 - 1)
    p.grad = (torch.rand(n, generator=g) * 2 - 1) * 1e-2
    kwargs = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    kwargs.update(variant)
    opt = torch.optim.AdamW([p], **kwargs)
    times = []
    with torch.no_grad():
        for r in range(reps + 1):
            t0 = time.perf_counter()
            opt.step()
            dt = time.perf_counter() - t0
            if r > 0:  # the first step allocates exp_avg / exp_avg_sq
                times.append(dt)
    del opt, p
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--stowage", default=os.path.join(ROOT, "build", "cli",
                                                      "stowage"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--params", default="64M")
    ap.add_argument("--runs", type=int, default=5,
                    help="repetitions of the whole set")
    ap.add_argument("--reps", type=int, default=5,
                    help="timed steps per benchmark invocation")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()

    n = parse_count(args.params)
    t = str(args.threads)
    size = str(n * 4)  # triad arrays as long as the master weights
    cmds = {
        "triad": [args.stowage, "bench", "memcpy", "--threads", t, "--size",
                  size, "--reps", str(args.reps), "--json"],
        "adam_bf16": [args.stowage, "bench", "adam", "--params", str(n),
                      "--threads", t, "--grad", "bf16", "--out", "bf16",
                      "--reps", str(args.reps), "--json"],
        "adam_bf16_checked": [args.stowage, "bench", "adam", "--params",
                              str(n), "--threads", t, "--grad", "bf16",
                              "--out", "bf16", "--check", "--reps",
                              str(args.reps), "--json"],
        "adam_fp32": [args.stowage, "bench", "adam", "--params", str(n),
                      "--threads", t, "--grad", "fp32", "--out", "none",
                      "--reps", str(args.reps), "--json"],
    }

    try:
        import torch
        torch_version = torch.__version__
        torch.set_num_threads(args.threads)
        torch_parallel = torch.__config__.parallel_info()
        sig = inspect.signature(torch.optim.AdamW).parameters
        variants = {"torch_for_loop": {"foreach": False}}
        if "foreach" in sig:
            variants["torch_foreach"] = {"foreach": True}
        fused_note = "fused=True not offered by this torch's AdamW"
        if "fused" in sig:
            try:
                torch_adamw(torch, 1024, 1, {"fused": True}, 1)
                variants["torch_fused"] = {"fused": True}
                fused_note = "fused=True measured"
            except (RuntimeError, TypeError, ValueError) as e:
                fused_note = "fused=True refused on CPU: %s" % e
    except ImportError as e:
        torch = None
        torch_version = None
        torch_parallel = ""
        variants = {}
        fused_note = "torch not importable: %s" % e

    samples = {k: [] for k in list(cmds) + list(variants)}
    raw = {k: [] for k in cmds}
    for run in range(args.runs):
        for name, cmd in cmds.items():
            j = run_json(cmd)
            raw[name].append(j)
            samples[name].append(j["seconds"])
        for name, variant in variants.items():
            samples[name].append(min(torch_adamw(torch, n, args.threads,
                                                 variant, args.reps)))
        print("run %d/%d done" % (run + 1, args.runs), file=sys.stderr)

    def stats(name, per_second):
        s = samples[name]
        rates = [per_second / x for x in s]
        return {"best": max(rates), "worst": min(rates),
                "median": statistics.median(rates),
                "seconds": s}

    triad = stats("triad", 12.0 * n)
    copy_rates = [j["copy_bytes_per_s"] for j in raw["triad"]]
    res = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "machine": {
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "nproc": sh(["nproc"]),
            "lscpu": sh(["lscpu"]),
            "free": sh(["free", "-b"]),
            "loadavg_at_start": open("/proc/loadavg").read().strip(),
        },
        "threads": args.threads, "params": n, "runs": args.runs,
        "reps_per_run": args.reps,
        "torch_version": torch_version, "torch_fused": fused_note,
        "torch_parallel_info": torch_parallel,
        "commands": {k: " ".join(shlex.quote(os.path.relpath(c, ROOT)
                                             if c == args.stowage else c)
                                 for c in v)
                     for k, v in cmds.items()},
        "isa": raw["adam_bf16"][0]["isa"],
        "threads_bound": raw["adam_bf16"][0].get("threads_bound"),
        "triad_bytes_per_s": triad,
        "copy_bytes_per_s": {"best": max(copy_rates),
                             "worst": min(copy_rates)},
    }
    for name in ("adam_bf16", "adam_bf16_checked", "adam_fp32"):
        bpp = raw[name][0]["bytes_per_param"]
        res[name] = {"bytes_per_param": bpp,
                     "bytes_per_s": stats(name, bpp * n),
                     "params_per_s": stats(name, n)}
    for name in variants:
        res[name] = {"params_per_s": stats(name, n)}

    ratios = {}
    for name in ("adam_bf16", "adam_bf16_checked", "adam_fp32"):
        # Best against best, and each run against the same run's triad.
        per_run = [(res[name]["bytes_per_param"] * n / a) / (12.0 * n / b)
                   for a, b in zip(samples[name], samples["triad"])]
        ratios[name + "_bytes_per_s / triad_bytes_per_s"] = {
            "best_vs_best": res[name]["bytes_per_s"]["best"] / triad["best"],
            "per_run": per_run}
        for tv in variants:
            per_run = [b / a for a, b in zip(samples[name], samples[tv])]
            ratios[name + "_params_per_s / " + tv + "_params_per_s"] = {
                "best_vs_best": res[name]["params_per_s"]["best"]
                / res[tv]["params_per_s"]["best"],
                "per_run": per_run}
    res["ratios"] = ratios

    os.makedirs(args.out, exist_ok=True)
    stem = "adam-%s-%s" % (socket.gethostname(),
                           datetime.datetime.now().strftime("%Y%m%d-%H%M"))
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(res, f, indent=2)
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(markdown(res, variants))
    print(markdown(res, variants))
    print("wrote %s.{json,md}" % os.path.join(args.out, stem),
          file=sys.stderr)


def gbs(x):
    return "%.2f GB/s" % (x / 1e9)


def gps(x):
    return "%.3f G params/s" % (x / 1e9)


def markdown(res, variants):
    L = []
    L.append("# CPU Adam vs STREAM triad vs PyTorch AdamW\n")
    L.append("Date: %s. %d threads (%s bound to cores by hwloc), %d parameters "
             "(out of cache: %d MiB of Adam state and gradients, 16 B per "
             "parameter), ISA %s. "
             "%d runs of the whole set, interleaved; each number is the "
             "fastest of %d timed steps after one warm-up step within a run; "
             "best and worst run are shown because the machine is shared "
             "with other jobs (load average at start: %s).\n"
             % (res["date"], res["threads"], res["threads_bound"],
                res["params"], res["params"] * 16 // 2**20, res["isa"],
                res["runs"], res["reps_per_run"],
                res["machine"]["loadavg_at_start"]))
    L.append("## Results\n")
    L.append("| what | bytes/param | best | worst | median |")
    L.append("|---|---|---|---|---|")
    t = res["triad_bytes_per_s"]
    L.append("| STREAM triad (3 x 4 B/elem) | 12 | %s | %s | %s |"
             % (gbs(t["best"]), gbs(t["worst"]), gbs(t["median"])))
    c = res["copy_bytes_per_s"]
    L.append("| STREAM copy (2 x 4 B/elem) | 8 | %s | %s | |"
             % (gbs(c["best"]), gbs(c["worst"])))
    names = {"adam_bf16": "stowage Adam, bf16 grad, bf16 copy out",
             "adam_bf16_checked": "same, with its own NaN/Inf pass",
             "adam_fp32": "stowage Adam, fp32 grad, no copy (torch's work)"}
    for k, label in names.items():
        r = res[k]
        L.append("| %s | %d | %s, %s | %s, %s | %s |"
                 % (label, r["bytes_per_param"],
                    gbs(r["bytes_per_s"]["best"]),
                    gps(r["params_per_s"]["best"]),
                    gbs(r["bytes_per_s"]["worst"]),
                    gps(r["params_per_s"]["worst"]),
                    gps(r["params_per_s"]["median"])))
    for k in variants:
        r = res[k]["params_per_s"]
        L.append("| torch %s AdamW (fp32 grad) | 28 | %s | %s | %s |"
                 % (k, gps(r["best"]), gps(r["worst"]), gps(r["median"])))
    L.append("\ntorch %s (Debian python3-torch); %s. Its parallel setup:\n"
             % (res["torch_version"], res["torch_fused"]))
    L.append("```\n%s```\n" % res["torch_parallel_info"])
    L.append("STREAM counts 12 bytes per triad element although a "
             "write-allocating store also reads the destination line (16 "
             "bytes move); the Adam count likewise leaves out the read for "
             "ownership of the low-precision copy (2 bytes). Both are "
             "counted as the issue and STREAM define them.\n")
    L.append("## Ratios\n")
    L.append("| ratio | best vs best | per run (same run) |")
    L.append("|---|---|---|")
    for k, v in res["ratios"].items():
        L.append("| %s | %.2f | %s |" % (
            k, v["best_vs_best"], ", ".join("%.2f" % x for x in v["per_run"])))
    L.append("\n## Commands\n")
    for k, v in res["commands"].items():
        L.append("- %s: `%s`" % (k, v))
    L.append("- torch: `torch.set_num_threads(%d)`; one flat fp32 "
             "nn.Parameter of %d elements with an fp32 .grad; "
             "`torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, "
             "weight_decay=1e-2, foreach=...)`; `opt.step()` timed under "
             "no_grad, first step excluded" % (res["threads"], res["params"]))
    L.append("- this file: `/usr/bin/python3 bench/adam.py --threads %d "
             "--params %d --runs %d --reps %d`\n"
             % (res["threads"], res["params"], res["runs"],
                res["reps_per_run"]))
    L.append("## Machine\n")
    L.append("nproc: %s\n" % res["machine"]["nproc"])
    L.append("```\n%s\n```\n" % res["machine"]["lscpu"])
    L.append("```\n%s\n```\n" % res["machine"]["free"])
    return "\n".join(L)


if __name__ == "__main__":
    main()
