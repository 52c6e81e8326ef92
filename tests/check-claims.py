#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
#
# tests/check-claims.py: the figures README.md and docs/*.md quote are the
# ones the tests print.  A quoted figure carries a marker right after it,
#   within 8.7%<!-- claim cost.korthikanti.step.worst-pct -->
# and a test prints the same name as a TAP comment, "# claim NAME VALUE"
# (tests/testutil-claim.h; tests/oracle/train_oracle.py prints its own).
# Each run checks one source (the part before the first dot), running the
# test program given after it; "bench" reads bench/results/ instead.
#
#   check-claims.py ROOT SOURCE [COMMAND...]
#
# A marker "<!-- claim NAME -->" holds when the quoted number equals the
# printed one to the quoted digits (a quote without a sign, as in "short
# by 21.1%", is the printed value's magnitude); "<!-- claim NAME >= -->"
# when the quoted number is at least the printed one (figures that vary
# with the machine, such as floating-point agreement that depends on the
# CPU's BLAS kernels).  A marker right after a backtick is shown in code,
# not a marker.  Exit 0 every marker of SOURCE holds, 1 one does not or names
# nothing, 2 bad usage or the command failed, 77 the command skipped every
# test that prints the source's claims (the output says which).
import decimal
import os
import re
import subprocess
import sys

# Each source's producer; bench claims come from the records named here.
SOURCES = ("cost", "memory", "published", "sim", "lower", "search",
           "oracle", "bench")

# bench.NAME: (file under bench/results/, regular expression whose first
# group is the figure).  These are records, not tests: a figure there is
# what one run on one machine measured, and the record says which.
BENCH = {
    # Issue 40's run after the softmax rows per width and the threaded
    # accumulation (2026-11-29 06:09; the run at 06:04 is docs/executor.md's
    # second, 04:07 and 04:10 the records before):
    # stowage in --precision fp32 and bf16, the GEMMs' share from inside
    # the steps.
    "bench.cpu-train-issue40.ratio-median": (
        "cpu-train-vm-20261129-0609.md",
        r"- fp32: ([\d.]+)x \(CPU time [\d.]+x\) PyTorch eager, fp32"),
    "bench.cpu-train-issue40.cpu-ratio": (
        "cpu-train-vm-20261129-0609.md",
        r"- fp32: [\d.]+x \(CPU time ([\d.]+)x\) PyTorch eager, fp32"),
    "bench.cpu-train-issue40.compile-ratio": (
        "cpu-train-vm-20261129-0609.md",
        r"- fp32: ([\d.]+)x \(CPU time [\d.]+x\) PyTorch torch.compile"),
    "bench.cpu-train-issue40.compile-cpu-ratio": (
        "cpu-train-vm-20261129-0609.md",
        r"- fp32: [\d.]+x \(CPU time ([\d.]+)x\) PyTorch torch.compile"),
    "bench.cpu-train-issue40.bf16-ratio": (
        "cpu-train-vm-20261129-0609.md",
        r"- bf16: ([\d.]+)x \(CPU time [\d.]+x\) PyTorch eager, bf16 autocast"),
    "bench.cpu-train-issue40.bf16-cpu-ratio": (
        "cpu-train-vm-20261129-0609.md",
        r"- bf16: [\d.]+x \(CPU time ([\d.]+)x\) PyTorch eager, bf16 autocast"),
    "bench.cpu-train-issue40.torch-version": (
        "cpu-train-vm-20261129-0609.md", r"PyTorch from PyPI: torch (\d+\.\d+)\.\d"),
    "bench.cpu-train-issue40.gemm-peak-fp32": (
        "cpu-train-vm-20261129-0609.md",
        r"Inside the steps of stowage train, fp32 .*?GFLOP/s by CPU time, "
        r"([\d.]+) of its peak"),
    "bench.cpu-train-issue40.nongemm-cpu-fp32": (
        "cpu-train-vm-20261129-0609.md",
        r"Inside the steps of stowage train, fp32 .*?, (\d+)% of its CPU "
        r"time per thread"),
    "bench.cpu-train-issue40.nongemm-wall-fp32": (
        "cpu-train-vm-20261129-0609.md",
        r"Inside the steps of stowage train, fp32 .*?outside the GEMMs "
        r"[\d.]+ s, (\d+)% of the step's wall time"),
    "bench.cpu-train-issue40.nongemm-wall-bf16": (
        "cpu-train-vm-20261129-0609.md",
        r"Inside the steps of stowage train --precision bf16 .*?outside the "
        r"GEMMs [\d.]+ s, (\d+)% of the step's wall time"),
    "bench.cpu-train-issue40.nongemm-cpu-bf16": (
        "cpu-train-vm-20261129-0609.md",
        r"Inside the steps of stowage train --precision bf16 .*?, (\d+)% of "
        r"its CPU time per thread"),
    "bench.gpu-h200-1112.ratio": (
        "gpu-h200-20261126-1112/gpu-train-bf16.md",
        r"stowage / PyTorch tokens/s: ([\d.]+)x"),
    "bench.gpu-h200-1120.ratio": (
        "gpu-h200-20261126-1120/gpu-train-bf16.md",
        r"stowage / PyTorch tokens/s: ([\d.]+)x"),
    "bench.gpu-h100-1101.ratio": (
        "gpu-h100-20261126-1101/gpu-train-bf16.md",
        r"stowage / PyTorch tokens/s: ([\d.]+)x"),
    "bench.gpu-h200-1112.stowage-tokens": (
        "gpu-h200-20261126-1112/gpu-train-bf16.md",
        r"\| stowage train --backend cuda \| [\d.]+ \| (\d+) \|"),
    "bench.gpu-h200-1112.torch-tokens": (
        "gpu-h200-20261126-1112/gpu-train-bf16.md",
        r"\| PyTorch eager \| [\d.]+ \| (\d+) \|"),
    "bench.gpu-h200-1120.stowage-tokens": (
        "gpu-h200-20261126-1120/gpu-train-bf16.md",
        r"\| stowage train --backend cuda \| [\d.]+ \| (\d+) \|"),
    "bench.gpu-h200-1120.torch-tokens": (
        "gpu-h200-20261126-1120/gpu-train-bf16.md",
        r"\| PyTorch eager \| [\d.]+ \| (\d+) \|"),
    "bench.gpu-h100-1101.stowage-tokens": (
        "gpu-h100-20261126-1101/gpu-train-bf16.md",
        r"\| stowage train --backend cuda \| [\d.]+ \| (\d+) \|"),
    "bench.gpu-h100-1101.torch-tokens": (
        "gpu-h100-20261126-1101/gpu-train-bf16.md",
        r"\| PyTorch eager \| [\d.]+ \| (\d+) \|"),
    # The cuda backend against PyTorch (tests/oracle/, --backend cuda),
    # as the GPU suite printed it in that run.
    "bench.gpu-h200-1112.oracle-weights-worst": (
        "gpu-h200-20261126-1112/gpu.log",
        r"tied-qkv-bias-recompute: worst relative error ([\d.e+-]+)"),
    "bench.search-1255.llama-65b.seconds": (
        "search-vm-20261122-1255.md",
        r"\| LLaMA-65B, 1024xA100-80GB, batch 2048 \| \d+ \| \d+ \| ([\d.]+) \|"),
    "bench.search-1255.llama-65b.layouts": (
        "search-vm-20261122-1255.md",
        r"\| LLaMA-65B, 1024xA100-80GB, batch 2048 \| (\d+) \|"),
}

MARKER = re.compile(r"<!--\s*claim\s+(\S+)(\s+>=)?\s*-->")
# The number just before a marker, past a unit or a closing parenthesis.
NUMBER = re.compile(
    r"([+\-\u2212]?\d[\d,]*(?:\.\d+)?(?:e[+\-\u2212]?\d+)?)"
    r"\s*(?:%|x|\u00d7|\s?s|\s?GiB|\s?MiB|\s?GB)?\)?\s*$")
CLAIM = re.compile(r"^#?\s*claim\s+(\S+)\s+(\S+)\s*$")


def documents(root):
    yield os.path.join(root, "README.md")
    docs = os.path.join(root, "docs")
    for name in sorted(os.listdir(docs)):
        if name.endswith(".md"):
            yield os.path.join(docs, name)


def markers(root):
    """(file, line, name, quoted text, at_least) for every marker."""
    out = []
    for path in documents(root):
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                for m in MARKER.finditer(line):
                    if line[:m.start()].endswith("`"):
                        continue  # one shown in code, not a marker
                    before = MARKER.sub("", line[:m.start()])
                    n = NUMBER.search(before)
                    out.append((os.path.relpath(path, root), lineno,
                                m.group(1), n.group(1) if n else None,
                                bool(m.group(2))))
    return out


def to_decimal(text):
    t = text.replace(",", "").replace("\u2212", "-").lstrip("+")
    return decimal.Decimal(t)


def holds(quoted, printed, at_least):
    q = to_decimal(quoted)
    p = decimal.Decimal(printed)
    if quoted[0] not in "+-\u2212":
        p = abs(p)
    if at_least:
        return p <= q
    # Equal to the quoted digits: within half a unit of its last place.
    half = decimal.Decimal(5).scaleb(q.as_tuple().exponent - 1)
    return abs(p - q) <= half


def bench_claims(root):
    got = {}
    for name, (file, pattern) in BENCH.items():
        path = os.path.join(root, "bench", "results", file)
        with open(path, encoding="utf-8") as f:
            m = re.search(pattern, f.read())
        if m:
            got[name] = m.group(1)
    return got, ""


def run_claims(command):
    r = subprocess.run(command, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    got = {}
    for line in r.stdout.splitlines():
        m = CLAIM.match(line.strip())
        if m:
            got[m.group(1)] = m.group(2)
    if r.returncode != 0:
        sys.stdout.write(r.stdout[-4000:])
        print("check-claims: %s exited %d" % (command[0], r.returncode))
        sys.exit(2)
    skips = [l for l in r.stdout.splitlines()
             if l.startswith("ok ") and "# SKIP" in l]
    return got, "\n".join(skips)


def main(argv):
    if len(argv) < 3 or argv[2] not in SOURCES:
        print("usage: check-claims.py ROOT SOURCE [COMMAND...]; SOURCE one "
              "of " + ", ".join(SOURCES))
        return 2
    root, source, command = argv[1], argv[2], argv[3:]
    found = markers(root)
    status = 0
    for file, line, name, _, _ in found:
        if name.split(".")[0] not in SOURCES:
            print("%s:%d: claim %s: no such source" % (file, line, name))
            status = 1
    mine = [m for m in found if m[2].split(".")[0] == source]
    if source == "bench":
        got, skips = bench_claims(root)
    elif command:
        got, skips = run_claims(command)
    else:
        print("check-claims: %s needs the test command that prints it"
              % source)
        return 2
    if mine and not got and skips:
        print(skips)
        print("check-claims: %s printed no claims (skipped above): %d "
              "markers not checked" % (source, len(mine)))
        return 77
    for file, line, name, quoted, at_least in mine:
        where = "%s:%d: claim %s" % (file, line, name)
        if quoted is None:
            print("%s: no number before the marker" % where)
            status = 1
        elif name not in got:
            print("%s: quoted %s, but nothing prints it" % (where, quoted))
            status = 1
        elif not holds(quoted, got[name], at_least):
            print("%s: quoted %s, the test prints %s%s" %
                  (where, quoted, got[name],
                   " (the quote must be at least that)" if at_least else ""))
            status = 1
        else:
            print("%s: %s%s (printed %s)" %
                  (where, ">= " if at_least else "", quoted, got[name]))
    quoted_names = {m[2] for m in mine}
    for name in sorted(set(got) - quoted_names):
        print("(printed, not quoted: %s %s)" % (name, got[name]))
    print("check-claims: %s: %d markers, %s" %
          (source, len(mine), "all hold" if status == 0 else "FAILED"))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
