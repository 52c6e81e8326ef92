#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Wall time of `stowage fit` and `stowage mem` for a few questions, best and
# median of N runs of the whole process (start-up included), with the
# machine described.  Writes bench/results/fit-latency-HOST-DATE.md.
#   bench/fit.sh [RUNS]        (default 50; needs a built ./build)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-50}
exe=build/cli/stowage
[ -x "$exe" ] || { echo "fit.sh: build first (./build.sh)" >&2; exit 2; }

time_cmd() { # prints best and median milliseconds of $runs runs of "$@"
  local t=()
  for ((i = 0; i < runs; i++)); do
    local s e
    s=$(date +%s%N)
    "$@" >/dev/null || [ $? -eq 1 ]
    e=$(date +%s%N)
    t+=($(((e - s) / 1000)))
  done
  printf '%s\n' "${t[@]}" | sort -n | awk -v n="$runs" '
    NR == 1 { best = $1 } NR == int((n + 1) / 2) { med = $1 }
    END { printf "%.1f %.1f\n", best / 1000, med / 1000 }'
}

out=bench/results/fit-latency-$(hostname -s)-$(date +%Y%m%d-%H%M).md
{
  echo "# stowage fit / mem latency"
  echo
  echo "Machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs),"
  echo "$(free -g | awk '/Mem:/ {print $2}') GiB RAM; $(uname -sr)."
  echo "Commit: $(git rev-parse --short HEAD). Runs per command: $runs (whole"
  echo "process, start-up included, measured with date +%s%N)."
  echo
  echo "| command | best ms | median ms |"
  echo "|---|---|---|"
  while IFS= read -r cmd; do
    read -r best med < <(time_cmd $exe $cmd)
    echo "| \`stowage $cmd\` | $best | $med |"
  done <<'CMDS'
fit llama-65b --gpus 8xA100-80GB
fit llama-65b --gpus 64xA100-80GB
fit llama-3.1-405b --gpus 128xH100-SXM
mem llama-65b --gpus 8xA100-80GB --zero 3
CMDS
} >"$out"
cat "$out"
