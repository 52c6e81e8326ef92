#!/bin/bash
# SPDX-License-Identifier: MIT
#
# bench/search.sh: how fast `stowage plan` searches, in layouts evaluated
# per second on one core (taskset -c 0), for the issue's two cases
# (LLaMA-65B on 1024 A100-80GB, a 1T model on 4096) and, when Calculon
# (calculon-ai/calculon) is installed beside it, Calculon's brute-force
# `llm-optimal-execution` on the same model and GPU count, side by side.
# Writes bench/results/search-<host>-<date>.md with the commands.
#
#   ninja -C build && bench/search.sh [RUNS]
#
# With STOWAGE_BASE=path/to/another/stowage (a build of an older commit),
# each case runs both binaries in turn, RUNS times each, and the table
# gives the median search time and wall time of each, their ratio, and
# whether the two answer alike (the --json plans without search_time_s):
#
#   STOWAGE_BASE=../f9da909/build/cli/stowage bench/search.sh 9
#
# Calculon is looked for as bench/.work/calculon (a checkout of
# calculon-ai/calculon with bin/calculon) run by bench/venv/bin/python.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
STOWAGE=${STOWAGE:-$ROOT/build/cli/stowage}
STOWAGE_BASE=${STOWAGE_BASE:-}
RUNS=${1:-5}
PY=${PYTHON:-python3}
host=$(hostname -s)
stamp=$(date -u +%Y%m%d-%H%M)
out="$HERE/results/search-$host-$stamp.md"
CALC_DIR="$HERE/.work/calculon"
CALC_PY="$HERE/venv/bin/python"

run_stowage () { # label, then the plan arguments
  local label=$1; shift
  local best_rate=0 best_t=0 n=0 rates=()
  for i in $(seq "$RUNS"); do
    local j
    j=$(taskset -c 0 "$STOWAGE" plan "$@" --top 1 --json)
    read -r n t < <(echo "$j" | $PY -c 'import json,sys; o=json.load(sys.stdin); print(o["candidates_evaluated"], o["search_time_s"])')
    local r
    r=$($PY -c "print(round($n/$t))")
    rates+=("$r")
    if [ "$r" -gt "$best_rate" ]; then best_rate=$r; best_t=$t; fi
  done
  local best
  best=$(taskset -c 0 "$STOWAGE" plan "$@" --top 1 --json | $PY -c 'import json,sys; o=json.load(sys.stdin); p=o["plans"][0]; l=p["layout"]; print("tp%s pp%s vpp%s dp%s cp%s zero%s mb%s rc:%s, %.4g s/step, MFU %.1f%%" % (l.get("tp"),l.get("pp"),l.get("vpp"),l.get("dp"),l.get("cp"),l.get("zero"),l.get("micro_batch"),l.get("recompute"),p["step_time_s"],100*p["mfu"]))' 2>/dev/null || echo "?")
  printf '| %s | %s | %s | %.3f | %s | %s |\n' "$label" "$n" "$best_rate" "$best_t" "${rates[*]}" "$best" >> "$out"
  echo "$label: $n layouts, best $best_rate layouts/s (${best_t}s); runs: ${rates[*]}"
}

timed_run () { # binary, then the plan arguments: layouts, search s, wall s
  local bin=$1; shift
  local start end j
  start=$(date +%s.%N)
  j=$(taskset -c 0 "$bin" plan "$@" --top 1 --json)
  end=$(date +%s.%N)
  echo "$j" | $PY -c "import json,sys; o=json.load(sys.stdin); print(o['candidates_evaluated'], o['search_time_s'], $end - $start)"
}

answers () { # binary, then the plan arguments: the --json plans, untimed
  local bin=$1; shift
  taskset -c 0 "$bin" plan "$@" --json | $PY -c 'import json,sys; o=json.load(sys.stdin); o.pop("search_time_s", None); print(json.dumps(o, sort_keys=True))'
}

median () {
  $PY -c 'import statistics,sys; print("%.4f" % statistics.median(float(x) for x in sys.argv[1:]))' "$@"
}

ratio () {
  $PY -c 'import sys; print("%.2f" % (float(sys.argv[1]) / float(sys.argv[2])))' "$1" "$2"
}

compare_stowage () { # label, then the plan arguments; this binary against STOWAGE_BASE
  local label=$1; shift
  local n=0 t w searches=() walls=() base_searches=() base_walls=()
  for i in $(seq "$RUNS"); do
    read -r n t w < <(timed_run "$STOWAGE_BASE" "$@")
    base_searches+=("$t"); base_walls+=("$w")
    read -r n t w < <(timed_run "$STOWAGE" "$@")
    searches+=("$t"); walls+=("$w")
  done
  local s b sw bw same=no
  s=$(median "${searches[@]}"); b=$(median "${base_searches[@]}")
  sw=$(median "${walls[@]}"); bw=$(median "${base_walls[@]}")
  if [ "$(answers "$STOWAGE" "$@")" = "$(answers "$STOWAGE_BASE" "$@")" ]; then same=yes; fi
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$label" "$n" "$s" "$b" "$(ratio "$s" "$b")" "$sw" "$bw" "$(ratio "$sw" "$bw")" "$same" >> "$out"
  echo "$label: $n layouts; search $s s against $b s, wall $sw s against $bw s; same answers: $same"
  echo "  search s, this: ${searches[*]}"
  echo "  search s, base: ${base_searches[*]}"
  {
    echo "- $label, this: ${searches[*]}"
    echo "- $label, base: ${base_searches[*]}"
  } >> "$out.runs"
}

if [ -n "$STOWAGE_BASE" ]; then
  base_rev=$(git -C "$(dirname "$STOWAGE_BASE")" rev-parse --short HEAD 2>/dev/null || echo '?')
  {
    echo "# stowage plan search speed against $base_rev ($host, $(date -u +%Y-%m-%dT%H:%MZ))"
    echo
    echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), one core (taskset -c 0);"
    echo "stowage $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') (this) against $base_rev (base: $STOWAGE_BASE),"
    echo "$RUNS runs each, the two binaries in turn; medians.  Ratio: this / base."
    echo "Same answers: the two binaries' \`--json\` plans (top 10) are identical but for search_time_s."
    echo
    echo "| case | layouts evaluated | search s, this | search s, base | ratio | wall s, this | wall s, base | ratio | same answers |"
    echo "|---|---|---|---|---|---|---|---|---|"
  } > "$out"
  : > "$out.runs"
  compare_stowage "LLaMA-65B, 1024xA100-80GB (issue 35's case)" \
    llama-65b --gpus 1024xA100-80GB
  compare_stowage "LLaMA-65B, 1024xA100-80GB, batch 2048" \
    llama-65b --gpus 1024xA100-80GB --global-batch 2048
  compare_stowage "1T (korthikanti-1t), 4096xA100-80GB, batch 4096" \
    korthikanti-1t --gpus 4096xA100-80GB --global-batch 4096
  compare_stowage "MT-NLG 530B, 2240xA100-80GB, batch 2240 (fp16, no flash)" \
    mt-nlg-530b --gpus 2240xA100-80GB --global-batch 2240 --precision fp16 --no-flash
  {
    echo
    echo "Commands: \`taskset -c 0 STOWAGE plan MODEL --gpus SPEC [--global-batch N] --top 1 --json\`,"
    echo "for STOWAGE this and base in turn (search_time_s is the search alone; wall s the"
    echo "whole process, start-up included)."
    echo
    echo "Search s, every run:"
    echo
    cat "$out.runs"
  } >> "$out"
  rm -f "$out.runs"
  echo "wrote $out"
  exit 0
fi

{
  echo "# stowage plan search speed ($host, $(date -u +%Y-%m-%dT%H:%MZ))"
  echo
  echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), one core (taskset -c 0);"
  echo "stowage $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $RUNS runs each, best run shown (the machine is shared)."
  echo
  echo "| case | layouts evaluated | layouts/s (best) | search s (best) | layouts/s, every run | best layout |"
  echo "|---|---|---|---|---|---|"
} > "$out"

run_stowage "LLaMA-65B, 1024xA100-80GB, batch 2048" \
  llama-65b --gpus 1024xA100-80GB --global-batch 2048
run_stowage "1T (korthikanti-1t), 4096xA100-80GB, batch 4096" \
  korthikanti-1t --gpus 4096xA100-80GB --global-batch 4096
run_stowage "MT-NLG 530B, 2240xA100-80GB, batch 2240 (fp16, no flash)" \
  mt-nlg-530b --gpus 2240xA100-80GB --global-batch 2240 --precision fp16 --no-flash
run_stowage "MT-NLG 530B, Megatron space only (ZeRO<=1), 2240xA100-80GB" \
  mt-nlg-530b --gpus 2240xA100-80GB --global-batch 2240 --precision fp16 --no-flash --engine megatron
# Calculon's README case: turing-530B on 5128 A100s, max batch 2520, float16
# (~1 min there).  5128 = 8 x 641, so dp is a multiple of 641: stowage needs
# an exact batch and takes 2564 = 4 x 641 (Calculon rounds its batch to a
# multiple of dp instead).
run_stowage "MT-NLG 530B, 5128xA100-80GB, batch 2564 (Calculon's README case)" \
  mt-nlg-530b --gpus 5128xA100-80GB --global-batch 2564 --precision fp16 --no-flash

{
  echo
  echo "Commands: \`taskset -c 0 build/cli/stowage plan MODEL --gpus SPEC --global-batch N --top 1 --json\`"
  echo "(search_time_s is the search alone; candidates_evaluated counts every layout the memory model saw)."
  echo
  echo "## Calculon (calculon-ai/calculon) side by side"
  echo
} >> "$out"

if [ -x "$CALC_PY" ] && [ -f "$CALC_DIR/bin/calculon" ]; then
  app="$CALC_DIR/models/turing-530B.json"
  [ -f "$app" ] || app="$CALC_DIR/examples/models/turing-530B.json"
  sys="$CALC_DIR/systems/a100_80g.json"
  [ -f "$sys" ] || sys="$CALC_DIR/examples/a100_80g.json"
  # -m: the README's micro-batch break; without it 2240 GPUs is 4.5M executions
  # (hours in Python).  bench/calculon.sh has the full side-by-side runs.
  cmd=(timeout "${CALCULON_LIMIT:-600}" taskset -c 0 env PYTHONPATH="$CALC_DIR" "$CALC_PY" "$CALC_DIR/bin/calculon" llm-optimal-execution "$app" 2240 2240 float16 "$sys" /tmp/calculon-out.json -c 1 -m -n)
  echo "\`${cmd[*]}\`" >> "$out"
  echo '```' >> "$out"
  start=$(date +%s.%N)
  { "${cmd[@]}" 2>&1 || echo "exit status $? (124: stopped by timeout)"; } | tail -8 | tee -a "$out"
  end=$(date +%s.%N)
  echo '```' >> "$out"
  echo "wall clock: $($PY -c "print(round($end-$start,1))") s" >> "$out"
else
  cat >> "$out" <<'EOT'
**Not run: Calculon could not be obtained on this machine.**  calculon-ai/calculon
is not published on PyPI (the PyPI package named "calculon", 1.1.1, is an
unrelated producer-consumer library by another author: `pip download calculon`
fetches it), and GitHub is not reachable from here, so there is no side-by-side
run.  The only figure available is Calculon's own README: `calculon
llm-optimal-execution models/turing-530B.json 5128 2520 float16
systems/a100_80g.json output.json -m` takes "~1 min" (multiprocessing over the
machine's cores).  The row "MT-NLG 530B, 5128xA100-80GB, batch 2564" above is
stowage on that case (batch rounded to a multiple of dp), on one core.  To run Calculon side by side, check it
out into bench/.work/calculon, make bench/venv (python3 -m venv bench/venv;
bench/venv/bin/pip install psutil numpy) and rerun this script, or run
bench/calculon.sh (CALCULON=checkout) for the side-by-side comparison.
EOT
fi
echo "wrote $out"
