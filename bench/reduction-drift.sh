#!/bin/bash
# SPDX-License-Identifier: MIT
#
# bench/reduction-drift.sh: how far --reduction native moves a run.  The
# same job on N ranks of the cpu backend (mpirun) with the deterministic
# reduction (one rank's bytes) and the native one (MPI's order), in bf16
# and fp32: the losses step by step side by side, the largest difference,
# and how far the final weights moved.  Prints a Markdown record for
# bench/results/.
#
#   bench/reduction-drift.sh [BUILD] [STEPS] [RANKS]   (build/, 30, 4)
#
# The model: 2 layers, hidden 64, vocabulary 32,064 (Phi-3-mini's
# tokenizer, ../shared/data/tokenizers or $STOW_TOKENIZER), initialised
# here; the data: 6,000 prompt/completion lines (bench/ranks-common.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-30}
ranks=${3:-4}
source bench/ranks-common.sh
job_files "$build" drift 2

# Two micro-batches a rank a step: the accumulation's order changes too.
global=$((2 * ranks))
job=(train --model "$W/model" --data "$W/train.jsonl" --seq 64
     --micro-batch 1 --global-batch "$global" --steps "$steps" --lr 1e-3
     --zero 2 --threads 1)

echo "# --reduction native against deterministic: $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo "Host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //');"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg);"
echo "$($S --version 2>/dev/null | head -1); Open MPI $(mpirun --version | head -1 | awk '{print $NF}'); OMP_WAIT_POLICY=$OMP_WAIT_POLICY."
echo "Job: mpirun -np $ranks stowage ${job[*]#$W/} --precision P --reduction R"
echo "(global batch $global x 64 tokens, 2 micro-batches a rank)."

for precision in bf16 fp32; do
  for red in deterministic native; do
    out="$W/$precision-$red"
    mpirun "${root[@]}" --oversubscribe -np "$ranks" "$S" "${job[@]}" \
        --precision "$precision" --reduction "$red" --out "$out" \
        --log-json "$out.jsonl" >"$out.err" 2>&1 \
      || { cat "$out.err" >&2; exit 1; }
  done
  echo
  echo "## $precision"
  echo
  /usr/bin/python3 - "$W/$precision-deterministic" "$W/$precision-native" <<'P'
import json, struct, sys
from array import array

det, nat = sys.argv[1], sys.argv[2]
def losses(run):
    return [json.loads(l)["loss"] for l in open(run + ".jsonl")]
ld, ln = losses(det), losses(nat)
print("| step | deterministic | native | delta | relative |")
print("|---:|---:|---:|---:|---:|")
worst = (0.0, 0.0, 0)
for i, (a, b) in enumerate(zip(ld, ln), 1):
    d = b - a
    print(f"| {i} | {a:.9g} | {b:.9g} | {d:+.3g} | {abs(d) / abs(a):.3g} |")
    if abs(d) > worst[0]:
        worst = (abs(d), abs(d) / abs(a), i)
print()
print(f"Largest |delta loss|: {worst[0]:.3g} (relative {worst[1]:.3g}) at "
      f"step {worst[2]} of {len(ld)}; last step's: "
      f"{abs(ln[-1] - ld[-1]):.3g} (relative "
      f"{abs(ln[-1] - ld[-1]) / abs(ld[-1]):.3g}).")

def tensors(run):
    with open(run + "/latest/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        body = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        raw = body[t["data_offsets"][0]:t["data_offsets"][1]]
        if t["dtype"] == "F32":
            out[name] = array("f", raw)
        else:
            assert t["dtype"] == "BF16", t["dtype"]
            words = array("I", (h << 16 for h in array("H", raw)))
            out[name] = array("f", words.tobytes())
        dtype = t["dtype"]
    return out, dtype
wd, dtype = tensors(det)
wn, _ = tensors(nat)
total = differ = 0
big = (0.0, "", 0.0)
for name, a in wd.items():
    b = wn[name]
    total += len(a)
    for x, y in zip(a, b):
        if x != y:
            differ += 1
            if abs(x - y) > big[0]:
                big = (abs(x - y), name, abs(x))
print(f"Weights ({dtype}, {total} elements): {differ} differ "
      f"({100.0 * differ / total:.2f}%); largest |difference| {big[0]:.3g}"
      + (f" ({big[1]}, an element of magnitude {big[2]:.3g})" if differ else "")
      + ".")
P
done
echo
echo "Command: \`bench/reduction-drift.sh $build $steps $ranks\`."
