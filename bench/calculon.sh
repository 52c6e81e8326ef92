#!/bin/bash
# SPDX-License-Identifier: MIT
#
# bench/calculon.sh: stowage's `plan` search beside Calculon's brute-force
# `llm-optimal-execution` (calculon-ai/calculon, Isaev et al., SC'23) on the
# same model, GPU count and batch, one core each (taskset -c 0; Calculon
# with -c 1, i.e. a multiprocessing pool of one worker).  Writes
# bench/results/calculon-<host>-<date>.md: the machine, the exact commands,
# wall and CPU times, executions/layouts evaluated, layouts per second, the
# ratio of times and each tool's best layout and predicted throughput.
#
#   ninja -C build && CALCULON=/path/to/calculon bench/calculon.sh
#
# Calculon is not vendored, downloaded or rebuilt by this script.  Get a
# checkout yourself, e.g. (the reference used commit caa4b11f, 2024-02):
#
#   git clone https://github.com/calculon-ai/calculon bench/.work/calculon
#   git -C bench/.work/calculon checkout caa4b11f
#   python3 -m venv bench/venv && bench/venv/bin/pip install psutil numpy
#
# (The PyPI package named "calculon" is an unrelated project.)
# Environment: CALCULON (checkout; default bench/.work/calculon),
# CALCULON_PYTHON (default bench/venv/bin/python), CALCULON_LIMIT (seconds
# per Calculon run, default 600), STOWAGE (default build/cli/stowage),
# RUNS (stowage runs per case, best kept; default 5).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
STOWAGE=${STOWAGE:-$ROOT/build/cli/stowage}
CALCULON=${CALCULON:-$HERE/.work/calculon}
CPY=${CALCULON_PYTHON:-$HERE/venv/bin/python}
LIMIT=${CALCULON_LIMIT:-600}
RUNS=${RUNS:-5}
PY=python3
host=$(hostname -s)
stamp=$(date -u +%Y%m%d-%H%M)
out="$HERE/results/calculon-$host-$stamp.md"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ ! -f "$CALCULON/bin/calculon" ] || [ ! -d "$CALCULON/calculon/llm" ]; then
  echo "no Calculon checkout at $CALCULON (set CALCULON; see the header)" >&2
  exit 2
fi
if ! "$CPY" -c 'import numpy, psutil' 2>/dev/null; then
  echo "$CPY lacks numpy/psutil (see the header)" >&2
  exit 2
fi
[ -x "$STOWAGE" ] || { echo "no $STOWAGE: ninja -C build" >&2; exit 2; }

pick_file () { for f in "$@"; do [ -f "$f" ] && { echo "$f"; return; }; done; echo "none of: $*" >&2; exit 2; }
SYS=$(pick_file "$CALCULON/systems/a100_80g.json" "$CALCULON/examples/a100_80g.json")
T530=$(pick_file "$CALCULON/models/turing-530B.json" "$CALCULON/examples/models/turing-530B.json")
# LLaMA-65B as a Calculon application (Calculon's block has a 2-matrix GeLU
# MLP, no SwiGLU, no GQA, no embedding or LM head; these are the published
# dimensions, so its MLP has 2/3 of LLaMA's MLP weights and FLOPs).
L65="$work/llama-65B.json"
printf '{\n  "hidden": 8192,\n  "feedforward": 22016,\n  "seq_size": 2048,\n  "attn_heads": 64,\n  "attn_size": 128,\n  "num_blocks": 80\n}\n' > "$L65"
# Calculon's a100_80g.json defines only "float16" rates (312/78 TFLOPS, the
# same as bf16 on A100); "bfloat16" stops it with an AssertionError.
DTYPE=float16

calc_rev=$(git -C "$CALCULON" rev-parse --short HEAD 2>/dev/null || echo "not a git checkout")
{
  echo "# stowage plan beside Calculon llm-optimal-execution ($host, $(date -u +%Y-%m-%dT%H:%MZ))"
  echo
  echo "Machine: $(nproc) CPUs ($(lscpu | sed -n 's/^Model name: *//p')), $(free -g | awk '/^Mem:/{print $2}') GiB RAM,"
  echo "kernel $(uname -r), load average at start $(cut -d' ' -f1-3 /proc/loadavg) (the machine is shared)."
  echo "stowage $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || echo ' (working tree has uncommitted changes)'), binary built $(date -u -r "$STOWAGE" +%Y-%m-%dT%H:%MZ);"
  echo "Calculon $CALCULON ($calc_rev),"
  echo "Python $("$CPY" -c 'import sys; print(sys.version.split()[0])'), numpy $("$CPY" -c 'import numpy; print(numpy.__version__)'), psutil $("$CPY" -c 'import psutil; print(psutil.__version__)')."
  echo "Both tools on one core: \`taskset -c 0\`; Calculon with \`-c 1\` (one pool worker); Calculon runs capped at ${LIMIT} s with \`timeout\`."
  echo "Calculon datatype $DTYPE (its A100 system file has no bfloat16 entry); stowage runs $RUNS times per case, best kept."
  echo
} > "$out"

# Calculon: the full-space count (-d: loops without evaluating), then the
# real search with -m (its README's mbs-break), timed.
# Sets C_* variables for the summary.
run_calculon () { # label app procs max_batch
  local label=$1 app=$2 procs=$3 maxb=$4
  local base=(env PYTHONPATH="$CALCULON" "$CPY" "$CALCULON/bin/calculon" llm-optimal-execution)
  local full
  full=$("${base[@]}" -d "$app" "$procs" "$maxb" "$DTYPE" "$SYS" "$work/d.json" -c 1 -n 2>&1 | sed -n 's/^Total executions: //p')
  # SIGINT on timeout: the pool is torn down and its worker reaped, so the
  # worker's CPU time is still counted by /usr/bin/time.
  local cmd=(timeout -s INT -k 30 "$LIMIT" taskset -c 0 "${base[@]}" "$app" "$procs" "$maxb" "$DTYPE" "$SYS" "$work/c.json" -c 1 -m -n)
  rm -f "$work/c.json"
  local s e rc=0
  s=$(date +%s.%N)
  /usr/bin/time -f '%e %U %S %M' -o "$work/time" "${cmd[@]}" > "$work/c.log" 2>&1 || rc=$?
  e=$(date +%s.%N)
  echo "### Calculon: $label" >> "$out"
  echo >> "$out"
  echo "\`${cmd[*]}\` (PYTHONPATH=\$CALCULON; application $(basename "$app"): $(tr -d ' \n' < "$app"))" >> "$out"
  echo >> "$out"
  echo '```' >> "$out"
  tail -8 "$work/c.log" >> "$out"
  echo "exit status $rc; /usr/bin/time: wall, user, sys s, max RSS KiB: $(tail -1 "$work/time")" >> "$out"
  echo '```' >> "$out"
  $PY - "$work/c.log" "$work/c.json" "$work/time" "$rc" "$s" "$e" "$full" "$LIMIT" > "$work/c.env" <<'EOF'
import json, os, re, sys
log, js, tf, rc, s, e, full, limit = sys.argv[1:]
txt = open(log).read()
def grab(k):
    m = re.search(k + r': ([0-9.e+]+)', txt)
    return m.group(1) if m else ''
wall = float(e) - float(s)
try:
    w, u, sy, rss = open(tf).read().split()[-4:]
    cpu = float(u) + float(sy)
except Exception:
    cpu = float('nan')
v = dict(C_WALL='%.1f' % wall, C_CPU='%.1f' % cpu, C_TOTAL=grab('Total executions'),
         C_GOOD=grab('Good executions'), C_BAD=grab('Bad executions'),
         C_RATE=grab('Calculation rate'), C_FULL=full, C_RC=rc, C_BEST='', C_SR='',
         C_BATCH='', C_STEP='')
if rc in ('124', '137'):
    v['C_BEST'] = 'did not finish in %s s' % limit
elif os.path.exists(js):
    o = json.load(open(js))
    if o:
        x = o['0']['execution']; st = o['0']['stats']
        v['C_BEST'] = ('tp%d pp%d ppint%d dp%d mb%d rc:%s optshard:%s tpcomm:%s '
                       'tpoverlap:%s dpoverlap:%s offload w/a/o:%d/%d/%d, %.1f GiB' % (
            x['tensor_par'], x['pipeline_par'], x['pipeline_interleaving'],
            x['data_par'], x['microbatch_size'], x['activation_recompute'],
            x['optimizer_sharding'], x['tensor_par_comm_type'],
            x['tensor_par_overlap'], x['data_par_overlap'], x['weight_offload'],
            x['activations_offload'], x['optimizer_offload'],
            st['proc_mem_tier1_cap_req'] / 2**30))
        v['C_SR'] = '%.2f' % st['sample_rate']
        v['C_BATCH'] = str(x['batch_size'])
        v['C_STEP'] = '%.3f' % st['total_time']
    else:
        v['C_BEST'] = 'no execution fits'
else:
    v['C_BEST'] = 'failed (exit %s)' % rc
for k, val in v.items():
    print('%s=%r' % (k, val))
EOF
  # shellcheck disable=SC1090
  . "$work/c.env"
  echo >> "$out"
  echo "wall $C_WALL s, CPU $C_CPU s; full space (\`-d\`, no -m) $C_FULL executions." >> "$out"
  echo >> "$out"
}

# stowage: best of RUNS; sets S_* variables.
run_stowage () { # args for plan
  local best_t=999999 n=0 t w s e all=()
  for _ in $(seq "$RUNS"); do
    s=$(date +%s.%N)
    # exit 1: no layout fits (the JSON still has the counts)
    taskset -c 0 "$STOWAGE" plan "$@" --top 1 --json > "$work/s.json" || [ $? = 1 ]
    e=$(date +%s.%N)
    read -r n t < <($PY -c 'import json,sys; o=json.load(open(sys.argv[1])); print(o["candidates_evaluated"], o["search_time_s"])' "$work/s.json")
    w=$($PY -c "print('%.3f' % ($e-$s))")
    all+=("$t/$w")
    if $PY -c "import sys; sys.exit(0 if $t < $best_t else 1)"; then best_t=$t; S_WALL=$w; cp "$work/s.json" "$work/sbest.json"; fi
  done
  S_N=$n; S_T=$best_t; S_ALL="${all[*]}"
  $PY - "$work/sbest.json" > "$work/s.env" <<'PYS'
import json, sys
o = json.load(open(sys.argv[1]))
if not o["plans"]:
    v = dict(S_BEST="no layout fits (%d out of GPU memory, %d invalid)" % (o["out_of_memory"], o["invalid"]),
             S_SR="-", S_STEP="-", S_MFU="-")
else:
    p = o["plans"][0]; l = p["layout"]
    v = dict(S_BEST="tp%s pp%s vpp%s dp%s cp%s zero%s mb%s rc:%s sp:%s offload opt/params/act:%s/%s/%s %s %s, %.1f GiB" % (
                 l["tp"], l["pp"], l["vpp"], l["dp"], l["cp"], l["zero"], l["micro_batch"], l["recompute"],
                 l["sp"], l["offload_optimizer"], l["offload_params"], l["offload_activations"], l["precision"],
                 "flash" if l["flash_attention"] else "no-flash", p["total_bytes"] / 2**30),
             S_SR="%.2f" % (l["global_batch"] / p["step_time_s"]), S_STEP="%.3f" % p["step_time_s"],
             S_MFU="%.1f%%" % (100 * p["mfu"]))
for k, val in v.items():
    print("%s=%r" % (k, val))
PYS
  # shellcheck disable=SC1091
  . "$work/s.env"
  echo "\`taskset -c 0 $(basename "$STOWAGE") plan $* --top 1 --json\`: $S_N layouts; search_time_s/process wall s per run: $S_ALL" >> "$out"
  echo >> "$out"
}

rows=()
summary_calculon () { # label
  local crate cdone="$C_WALL"
  crate=$($PY -c "t='$C_TOTAL'; print('%.0f' % (float(t)/$C_WALL) if t else '-')")
  if [ "$C_RC" = 124 ] || [ "$C_RC" = 137 ]; then cdone=">$C_WALL (killed)"; fi
  rows+=("| $1 | Calculon -c 1 -m | ${C_TOTAL:-?} of $C_FULL | $cdone | $C_CPU | $crate | – | $C_BEST | ${C_SR:-–} (batch ${C_BATCH:-–}, ${C_STEP:-–} s) |")
}
summary_stowage () { # label variant
  local srate ratio ratio_w
  srate=$($PY -c "print('%.0f' % ($S_N/$S_T))")
  ratio=$($PY -c "print('%.0f' % ($C_WALL/$S_T))")
  ratio_w=$($PY -c "print('%.0f' % ($C_WALL/$S_WALL))")
  [ "$C_RC" = 0 ] || { ratio=">$ratio"; ratio_w=">$ratio_w"; }
  rows+=("| $1 | stowage $2 | $S_N | $S_T (process $S_WALL) | – | $srate | ${ratio}x (${ratio_w}x) | $S_BEST | $S_SR ($S_STEP s, MFU $S_MFU) |")
}

echo "## Runs" >> "$out"
echo >> "$out"

# (b) first: Calculon's README case, which finishes; its rate is used to
# project (a).  Turing-530B on 5128 A100s, max batch 2520: 5128 = 8 x 641,
# so pp = 1 (105 blocks) and Calculon takes batch 1923 (dp 641) or 1282
# (dp 1282), whichever rates better; stowage gets Calculon's batch.
run_calculon "Turing-530B, 5128 GPUs, max batch 2520 (its README case)" "$T530" 5128 2520
B=${C_BATCH:-1923}
summary_calculon "530B / 5128 / $B"
for v in "--precision fp16 --no-flash --engine megatron" "--precision fp16 --no-flash" ""; do
  # shellcheck disable=SC2086
  run_stowage mt-nlg-530b --gpus 5128xA100-80GB --global-batch "$B" $v
  summary_stowage "530B / 5128 / $B" "${v:-(default: bf16, flash)}"
done
rate530=$C_TOTAL; wall530=$C_WALL

# (a) LLaMA-65B on 1024 A100s, global batch 1024.
run_calculon "LLaMA-65B-like, 1024 GPUs, max batch 1024" "$L65" 1024 1024
summary_calculon "LLaMA-65B / 1024 / 1024"
for v in "--precision fp16 --no-flash --engine megatron" "--precision fp16 --no-flash" ""; do
  # shellcheck disable=SC2086
  run_stowage llama-65b --gpus 1024xA100-80GB --global-batch 1024 $v
  summary_stowage "LLaMA-65B / 1024 / 1024" "${v:-(default: bf16, flash)}"
done
if [ "$C_RC" = 124 ] || [ "$C_RC" = 137 ]; then
  proj=$($PY -c "n='$rate530'; print('%.1f h' % ($C_FULL/(float(n)/$wall530)/3600) if n else '?')")
  echo "Calculon did not finish LLaMA-65B in ${LIMIT} s (stopped with SIGINT; it prints nothing before the pool returns, so how far it got is not visible)." >> "$out"
  echo "Its full space is $C_FULL executions; at the 530B run's overall rate (${rate530:-?} executions in ${wall530} s on this core) that is about $proj without -m; -m skips larger micro-batches once one fits nowhere." >> "$out"
  echo >> "$out"
fi

{
  echo "## Side by side"
  echo
  echo "| case | tool | executions / layouts evaluated | search wall s | CPU s | per s | Calculon wall / stowage search (/ process) | best layout | predicted samples/s (batch, step s) |"
  echo "|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  cat <<'EOT'
Calculon's "per s" is its executions divided by the wall time of the whole
command (Python start-up included; its own "Calculation rate" line, in the
logs above, excludes start-up).  stowage's is candidates_evaluated over
search_time_s (the search alone); its process wall time is shown beside it.

## What each searches

* Calculon (`llm-optimal-execution`): TP over divisors of the GPU count and
  the heads; PP dividing the blocks; DP the rest; every pipeline
  interleaving; recompute full / attn_only / none; optimizer sharding
  (ZeRO-1) on/off; TP communication all-reduce, p2p_rs_ag or rs_ag
  (sequence parallelism) with optional all-gather redo; TP overlap none /
  ring / pipe; DP overlap; weight, activation and optimizer offload to the
  system's second memory tier (512 GiB at 32 GB/s in a100_80g.json); every
  micro-batch dividing the local batch; which network tier carries TP, PP
  and DP.  The batch is the largest multiple of DP not above the maximum,
  so layouts with different DP are ranked at different batch sizes.
  Not modelled: ZeRO-2/3 or FSDP, context or expert parallelism, GQA (the
  search fixes attention_type "multihead"), SwiGLU (2-matrix MLP), flash
  attention (s^2 scores are kept unless recomputed), embeddings, LM head
  and logits, bf16 in the shipped A100 file.
* stowage (`plan`): tp within the NVLink domain, pp, vpp, cp, ep, dp; ZeRO
  0-3; optimizer offload cpu/nvme, parameter offload (ZeRO-3), checkpoint
  offload; recompute none / selective / full / full:K; micro-batches
  dividing the replica's share of the exact global batch; sequence
  parallelism on with tp > 1; the real model (GQA, SwiGLU, vocabulary,
  flash attention by default).  It does not enumerate Calculon's TP
  communication variants, overlap switches or network-tier assignments as
  separate layouts.
EOT
} >> "$out"
echo "wrote $out"
