#!/bin/bash
# SPDX-License-Identifier: MIT
#
# bench/ranks.sh: the same training job on 1, 2 and 4 ranks of the cpu
# backend (mpirun), each ZeRO stage given, with each rank's comm stream
# busy and exposed seconds beside the simulated ones (--stream-times), and
# whether the checkpoints are the one rank's bytes.  Prints a Markdown
# record for bench/results/.
#
#   bench/ranks.sh [BUILD] [STEPS]      (default build/, 6 steps)
#
# The model: 4 layers, hidden 64, vocabulary 32,064 (Phi-3-mini's
# tokenizer, ../shared/data/tokenizers or $STOW_TOKENIZER), initialised
# here; the data: 6,000 prompt/completion lines, as the README's quick
# start writes them (bench/ranks-common.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-6}
source bench/ranks-common.sh
job_files "$build" ranks 4

job=(train --model "$W/model" --data "$W/train.jsonl" --precision bf16
     --seq 256 --micro-batch 1 --global-batch 16 --steps "$steps" --lr 1e-4
     --stream-times)

echo "# Several ranks on the cpu backend: $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo "Host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //');"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg);"
echo "$($S --version 2>/dev/null | head -1); Open MPI $(mpirun --version | head -1 | awk '{print $NF}'); OMP_WAIT_POLICY=$OMP_WAIT_POLICY."
echo "Job: ${job[*]#$W/} (global batch 16 x 256 tokens)."
echo
echo "| ranks | ZeRO | step (s, median) | tokens/s | rank | comm busy / exposed s (measured) | (simulated) | same bytes as 1 rank |"
echo "|---:|---:|---:|---:|---:|---|---|---|"

run () { # RANKS ZERO [OFFLOAD...]
  local n=$1 z=$2 out="$W/out-$1-$2${3:+-off}"
  local pre=() zero=()
  [ "$n" -gt 1 ] && pre=(mpirun "${root[@]}" --oversubscribe -np "$n")
  [ "$n" -gt 1 ] && zero=(--zero "$z" "${@:3}")
  "${pre[@]}" "$S" "${job[@]}" "${zero[@]}" --out "$out" \
      --log-json "$out-log-{rank}.jsonl" >"$out.err" 2>&1
  local med
  med=$(python3 - "$out-log-0.jsonl" <<'P'
import json, statistics, sys
t = [json.loads(l)["step_time_s"] for l in open(sys.argv[1])][1:]
print(f"{statistics.median(t):.3f}")
P
)
  local tps
  tps=$(python3 -c "print(round(16 * 256 / $med))")
  local same="(reference)"
  if [ "$n" -gt 1 ]; then
    cmp -s "$out/latest/model.safetensors" "$W/out-1-0/latest/model.safetensors" \
        && same=yes || same=NO
  fi
  # Each rank's comm line of --stream-times, in rank order of appearance.
  local r=0
  if [ "$n" -gt 1 ]; then
    (grep -E '^  comm ' "$out.err" || true) | while read -r _ b e _ sb se; do
      echo "| $n | $z${3:+ (${*:3})} | $med | $tps | $r | $b / $e | $sb / $se | $same |"
      r=$((r + 1))
    done
  else
    echo "| $n | $z | $med | $tps | - | - | - | $same |"
  fi
}

run 1 0
for z in 1 2 3; do run 2 "$z"; done
for z in 2 3; do run 4 "$z"; done
# ZeRO-Offload and ZeRO-Infinity on each rank.
run 2 2 --offload-optimizer cpu
run 2 3 --offload-optimizer cpu --offload-params cpu --resident-layers 0
echo
echo "Busy: the comm stream's collectives, waits for the slowest rank"
echo "included; exposed: the part no other stream overlapped."
