#!/usr/bin/python3
# SPDX-License-Identifier: MIT
#
# bench/train-nvme.py: ZeRO-Infinity's optimizer step as `stowage train`
# runs it (--offload-optimizer nvme), against its slowest stage (issue 21:
# at most 1.1x).  A model is made (`stowage init-model`), a plan file cuts
# its optimizer states into CHUNK-parameter chunks, and each run trains
# STEPS steps with --trace.  From the last step's trace (the ops as they
# ran): the optimizer phase is from the first op of the cpu_optim stream
# (the gradient norm, once every gradient is down) to the end of the last
# "states written"; the stages are the busy time of the nvme_read,
# cpu_optim and nvme_write streams over the step (reads may start during
# the backward: the program lets them).  The verdict is the median of the
# runs' phase / max(stage) ratios.  The disk's own figures beside it come
# from bench/nvme.sh (the store against fio on the same directory).
#
#   /usr/bin/python3 bench/train-nvme.py [--dir DIR] [--runs 3]
#       [--hidden 512] [--layers 8] [--chunk 4000000]
#
# Writes bench/results/train-nvme-<tag>-<date>.md.

import argparse
import datetime
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit("%s: exit %d\n%s" % (" ".join(cmd), r.returncode, r.stderr))
    return r


def stream_intervals(trace_path):
    with open(trace_path) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    by = {}
    for e in events:
        if e.get("ph") == "X":
            s = names.get((e["pid"], e["tid"]), str(e["tid"]))
            by.setdefault(s, []).append((e["ts"] / 1e6,
                                         (e["ts"] + e["dur"]) / 1e6,
                                         e["name"]))
    return by


def busy(iv):
    """Seconds covered by the union of the intervals."""
    total, end = 0.0, None
    for a, b, _ in sorted(iv):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stowage", default=os.path.join(ROOT, "build", "cli",
                                                      "stowage"))
    ap.add_argument("--dir", default="/var/tmp/stowage-bench",
                    help="where the swap files go (a real disk, not tmpfs)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=4000000,
                    help="parameters per optimizer chunk (swap_shard_params)")
    ap.add_argument("--tag", default="vm")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="train-nvme-")
    try:
        h = a.hidden
        cfg = dict(model_type="llama", hidden_size=h,
                   num_hidden_layers=a.layers, num_attention_heads=h // 64,
                   num_key_value_heads=h // 64,
                   intermediate_size=(8 * h // 3 + 63) // 64 * 64,
                   vocab_size=256, rope_theta=10000.0, rms_norm_eps=1e-5,
                   tie_word_embeddings=False, initializer_range=0.02)
        cfg_path = os.path.join(work, "config.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        model = os.path.join(work, "model")
        init = run([a.stowage, "init-model", cfg_path, "-o", model])
        plan = os.path.join(work, "plan.json")
        fit = [a.stowage, "fit", cfg_path, "--gpus", "1xH100-SXM", "--zero",
               "0", "--offload-optimizer", "nvme", "--offload-params", "none",
               "--recompute", "none", "--seq", "16", "--micro-batch", "1",
               "--global-batch", "1", "--precision", "bf16", "--emit", "plan",
               "-o", plan]
        run(fit)
        with open(plan) as f:
            text = f.read()
        text = re.sub(r'"swap_shard_params" : [0-9]+',
                      '"swap_shard_params" : %d' % a.chunk, text)
        with open(plan, "w") as f:
            f.write(text)
        data = os.path.join(work, "data.txt")
        with open(data, "w") as f:
            f.write(open(os.path.join(ROOT, "README.md")).read())
        rows = []
        train_cmd = None
        for i in range(a.runs):
            out = os.path.join(work, "out%d" % i)
            trace = os.path.join(work, "trace%d.json" % i)
            train_cmd = [a.stowage, "train", "--model", model, "--data", data,
                         "--tokenizer", "bytes", "--plan", plan, "--steps",
                         str(a.steps), "--out", out, "--offload-optimizer",
                         "nvme", "--nvme-dir", a.dir, "--trace", trace]
            r = run(train_cmd)
            by = stream_intervals(trace)
            opt = by.get("cpu_optim", [])
            rd = by.get("nvme_read", [])
            wr = by.get("nvme_write", [])
            if not opt or not wr:
                sys.exit("no optimizer ops in the trace: %s" % trace)
            start = min(x[0] for x in opt)
            end = max(x[1] for x in wr)
            phase = end - start
            stages = dict(read=busy(rd), adam=busy(opt), write=busy(wr))
            slowest = max(stages.values())
            chunks = re.search(r"(\d+) chunks? in", r.stderr)
            rows.append(dict(phase=phase, slowest=slowest,
                             ratio=phase / slowest, **stages,
                             chunks=int(chunks.group(1)) if chunks else 0))
            shutil.rmtree(out, ignore_errors=True)
        med = statistics.median(x["ratio"] for x in rows)
        now = datetime.datetime.now(datetime.timezone.utc)
        res = os.path.join(HERE, "results", "train-nvme-%s-%s.md" %
                           (a.tag, now.strftime("%Y%m%d-%H%M")))
        fs = run(["df", "-T", a.dir]).stdout
        load = open("/proc/loadavg").read().strip()
        params = re.search(r"(\d+) parameters", init.stdout)
        lines = [
            "# The NVMe optimizer step in `stowage train` against its "
            "slowest stage, %s" % now.strftime("%Y-%m-%d %H:%M UTC"), "",
            "%s parameters (hidden %d, %d layers), bf16, optimizer states on "
            "NVMe (12 B a parameter) in %d chunks of up to %d parameters; "
            "host %s, %d cores, load average at the end %s." %
            (params.group(1) if params else "?", h, a.layers,
             rows[0]["chunks"], a.chunk, socket.gethostname(),
             os.cpu_count(), load), "",
            "```", fs.strip(), "```", "",
            "Commands:", "", "```", " ".join(fit),
            "# then swap_shard_params set to %d in the plan" % a.chunk,
            " ".join(train_cmd), "```", "",
            "| run | phase s | read busy s | Adam busy s | write busy s | "
            "phase / slowest |", "|---|---|---|---|---|---|"]
        for i, x in enumerate(rows):
            lines.append("| %d | %.3f | %.3f | %.3f | %.3f | %.3f |" %
                         (i + 1, x["phase"], x["read"], x["adam"],
                          x["write"], x["ratio"]))
        lines += ["", "Median phase / slowest stage: **%.3f** (target <= 1.1)."
                  % med, ""]
        with open(res, "w") as f:
            f.write("\n".join(lines))
        print("\n".join(lines))
        print("wrote %s" % res)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
