#!/usr/bin/python3
# SPDX-License-Identifier: MIT
#
# bench/kernel-times.py: where a `stowage train` step goes on the cpu
# backend, from inside the step: the runtime's every kernel call, timed
# when STOWAGE_KERNEL_TIMES names a file (executor/kernel-times.h), summed
# per step (a step's calls run from its embedding's forward to the next
# one: one micro-batch a step) and set against the step times of
# --log-json.  The GEMMs' GFLOP/s are their own, as they ran in the step;
# what the kernel table does not hold (Adam, the gradient norm, copies,
# the driver) is the step less its kernels.  Used by bench/cpu-train.py;
# alone:
#
#   STOWAGE_KERNEL_TIMES=kt.jsonl stowage train ... --log-json log.jsonl
#   python3 bench/kernel-times.py kt.jsonl log.jsonl [--warmup 1]

import json
import statistics
import sys

# The table's entries by what they are (executor/kernels.h).
GROUPS = {
    "attention": ("attention_forward", "attention_backward"),
    "loss (softmax cross-entropy)": ("xent",),
    "norms (RMSNorm, its backward, column sums)": (
        "rmsnorm", "rms_rstd", "rmsnorm_backward", "colsum",
        "colsum_acc_zero", "colsum_acc", "colsum_acc_store"),
    "rotary, SwiGLU": ("rope", "swiglu", "swiglu_backward"),
    "embedding, zeroing": ("embed_forward", "embed_backward", "zero"),
}


def read(path):
    """(header, [step: {key: [calls, seconds, flops, cpu seconds]}]) of the
    last runtime in a STOWAGE_KERNEL_TIMES file (cpu seconds: the process's
    CPU time over the calls, every thread's); a GEMM's key says its
    operands:
    "gemm bf16" (both bf16: the kernel multiplies bf16 where it can) or
    "gemm fp32"."""
    header, steps = None, []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "kernel_times" in r:
                header, steps = r, []
                continue
            if r["entry"] == "embed_forward" or not steps:
                steps.append({})
            key = r["entry"]
            flops = 0.0
            if key == "gemm":
                key = "gemm bf16" if r["a_bf16"] and r["b_bf16"] \
                    else "gemm fp32"
                flops = 2.0 * r["m"] * r["n"] * r["k"]
            acc = steps[-1].setdefault(key, [0, 0.0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += r["ns"] * 1e-9
            acc[2] += flops
            acc[3] += r["cpu_ns"] * 1e-9
    return header, steps


def parts(kt_path, step_times):
    """Each step's parts, in seconds: {"step", "gemm", "gemm_flops",
    "gemm fp32", "gemm bf16", each group of GROUPS, "kernels",
    "outside", "gemm_cpu"} ("gemm_cpu": the GEMMs' CPU seconds over the
    threads, what they take where nothing else runs); with the file's
    header."""
    header, steps = read(kt_path)
    if len(steps) != len(step_times):
        sys.exit("kernel-times: %d steps of kernels against %d step times"
                 % (len(steps), len(step_times)))
    rows = []
    for s, t in zip(steps, step_times):
        row = {"step": t}
        row["gemm fp32"] = s.get("gemm fp32", [0, 0.0, 0.0])[1]
        row["gemm bf16"] = s.get("gemm bf16", [0, 0.0, 0.0])[1]
        row["gemm"] = row["gemm fp32"] + row["gemm bf16"]
        row["gemm_flops"] = sum(v[2] for k, v in s.items()
                                if k.startswith("gemm"))
        for g, entries in GROUPS.items():
            row[g] = sum(s.get(e, [0, 0.0])[1] for e in entries)
        row["gemm_cpu"] = sum(v[3] for k, v in s.items()
                              if k.startswith("gemm")) / header["threads"]
        row["kernels"] = sum(v[1] for v in s.values())
        row["outside"] = t - row["kernels"]
        rows.append(row)
    return header, rows


def median(rows):
    """The median of each part over @rows (steps)."""
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def table(med):
    """Markdown lines: each part's seconds and share of the step (the
    medians of each part: they need not add up to the step's)."""
    st = med["step"]
    lines = ["| part of the step | s | share |", "|---|---:|---:|"]
    rows = [("GEMMs (%.0f GFLOP/s in the step)"
              % (med["gemm_flops"] / med["gemm"] / 1e9), med["gemm"])]
    if med["gemm bf16"] > 0 and med["gemm fp32"] > 0:
        rows += [("- of which both operands bf16", med["gemm bf16"]),
                 ("- of which an fp32 operand", med["gemm fp32"])]
    rows += [(g, med[g]) for g in GROUPS]
    rows += [("outside the kernel table (Adam, the gradient norm, "
               "copies, the driver)", med["outside"])]
    for name, s in rows:
        lines.append("| %s | %.3f | %.1f%% |" % (name, s, 100 * s / st))
    lines.append("| the step (median) | %.3f | 100%% |" % st)
    return lines


def shapes(path, warmup):
    """Markdown lines: the GEMMs of the steps after @warmup grouped by
    (m, n, k), calls and seconds per step and their rate, slowest first."""
    steps = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "kernel_times" in r:
                steps = []
                continue
            if r["entry"] == "embed_forward" or not steps:
                steps.append([])
            steps[-1].append(r)
    kept = steps[warmup:]
    acc = {}
    for s in kept:
        for r in s:
            if r["entry"] != "gemm":
                continue
            a = acc.setdefault((r["m"], r["n"], r["k"]), [0, 0.0, 0.0])
            a[0] += 1
            a[1] += r["ns"] * 1e-9
            a[2] += 2.0 * r["m"] * r["n"] * r["k"]
    lines = ["| m | n | k | calls / step | s / step | GFLOP/s |",
             "|---:|---:|---:|---:|---:|---:|"]
    for (m, n, k), a in sorted(acc.items(), key=lambda kv: -kv[1][1]):
        lines.append("| %d | %d | %d | %d | %.3f | %.0f |"
                     % (m, n, k, a[0] // len(kept), a[1] / len(kept),
                        a[2] / a[1] / 1e9))
    return lines


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel_times")
    ap.add_argument("log_json")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--shapes", action="store_true",
                    help="also each GEMM shape's rate in the steps")
    a = ap.parse_args()
    with open(a.log_json) as f:
        times = [json.loads(line)["step_time_s"] for line in f]
    header, rows = parts(a.kernel_times, times)
    med = median(rows[a.warmup:])
    print("%s, %d threads; GEMMs: %s" % (header["dtype"], header["threads"],
                                         header["gemm"]))
    print("\n".join(table(med)))
    if a.shapes:
        print()
        print("\n".join(shapes(a.kernel_times, a.warmup)))


if __name__ == "__main__":
    main()
