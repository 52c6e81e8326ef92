#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# bench/nvme.sh: the NVMe store against fio on the same directory, file size,
# block size and queue depth (both O_DIRECT, sequential write then read),
# interleaved run by run so that both see the same machine load; then the
# optimizer swapper (pipelined step vs. each stage alone).  Writes
# bench/results/nvme-<date>.md with the machine, the exact commands, every
# run, the best, the median of the paired (same-run) ratios and the spread.
#
# Usage: bench/nvme.sh [DIR] ; knobs by environment: SIZE (2GiB), BS (1MiB),
# QD (32), RUNS (3), STOWAGE (build/cli/stowage), SWAP_SIZE (1GiB),
# SWAP_SHARD (64MiB).  fio is installed with apt-get when missing (it is a
# benchmark tool only, never a build dependency).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
dir=${1:-/var/tmp/stowage-bench}
size=${SIZE:-2GiB}
bs=${BS:-1MiB}
qd=${QD:-32}
runs=${RUNS:-3}
stowage=${STOWAGE:-$root/build/cli/stowage}
swap_size=${SWAP_SIZE:-1GiB}
swap_shard=${SWAP_SHARD:-64MiB}

# fio spells sizes without the "iB": 2GiB -> 2g, 1MiB -> 1m (powers of 2).
fio_size() { echo "$1" | sed -E 's/([0-9]+)([KMGT])i?B?$/\1\L\2/'; }

if ! command -v fio >/dev/null 2>&1; then
  echo "nvme.sh: installing fio" >&2
  apt-get install -y fio >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y fio >/dev/null; }
fi
[ -x "$stowage" ] || { echo "nvme.sh: build first: $stowage missing" >&2; exit 2; }
mkdir -p "$dir"
fstype=$(df -T "$dir" | awk 'NR==2 {print $2}')
if [ "$fstype" = tmpfs ]; then
  echo "nvme.sh: $dir is on tmpfs; O_DIRECT numbers there mean nothing" >&2
  exit 2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; rm -f "$dir/fio.dat"' EXIT
fsz=$(fio_size "$size")
fbs=$(fio_size "$bs")
# $1: write or read; $2: plain (fio's defaults, as the issue asks) or fixed
# (registered buffers and files, as the store itself uses).
fio_cmd() {
  local extra=""
  [ "$2" = fixed ] && extra="--fixedbufs --registerfiles"
  echo fio --name="$1" --filename="$dir/fio.dat" --size="$fsz" --bs="$fbs" \
    --iodepth="$qd" --ioengine=io_uring --direct=1 $extra \
    --rw="$1" --numjobs=1 --output-format=json
}
stow_cmd="$stowage bench nvme --dir $dir --size $size --block-size $bs --queue-depth $qd --engine io_uring --json"

for r in $(seq 1 "$runs"); do
  # Alternate who goes first, so neither always meets a warmer device.
  if [ $((r % 2)) = 1 ]; then order="fio stow"; else order="stow fio"; fi
  for who in $order; do
    if [ "$who" = fio ]; then
      for v in plain fixed; do
        rm -f "$dir/fio.dat"
        $(fio_cmd write $v) >"$tmp/fio-$v-w-$r.json"
        $(fio_cmd read $v) >"$tmp/fio-$v-r-$r.json"
      done
      rm -f "$dir/fio.dat"
    else
      $stow_cmd >"$tmp/stow-$r.json"
    fi
  done
  echo "nvme.sh: run $r of $runs done" >&2
done

swap_cmd="$stowage bench swapper --dir $dir --size $swap_size --shard-size $swap_shard --block-size $bs --queue-depth $qd --repeat 3 --json"
$swap_cmd >"$tmp/swap.json"
swap_host_cmd="$stowage bench swapper --mode host --size $swap_size --shard-size $swap_shard --repeat 3 --json"
$swap_host_cmd >"$tmp/swap-host.json"

out="$root/bench/results/nvme-$(date -u +%Y%m%d-%H%M%S).md"
{
  echo "# NVMe store vs fio, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "## Machine"
  echo
  echo '```'
  echo "kernel: $(uname -r)"
  echo "nproc: $(nproc)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "memory: $(free -h | awk '/Mem:/ {print $2}')"
  echo "fio: $(fio --version)"
  echo "stowage: $("$stowage" version | tr '\n' ' ')"
  echo "git: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo "\$ lsblk"
  lsblk 2>&1
  echo
  echo "\$ df -T $dir"
  df -T "$dir"
  echo '```'
  echo
  echo "## Commands (run $runs times, fio and stowage interleaved, order alternating)"
  echo
  echo '```'
  for v in plain fixed; do
    echo "$(fio_cmd write $v)"
    echo "$(fio_cmd read $v)"
  done
  echo "$stow_cmd"
  echo "$swap_cmd"
  echo "$swap_host_cmd"
  echo '```'
  echo
  python3 - "$tmp" "$runs" <<'PY'
import json, statistics, sys, os
tmp, runs = sys.argv[1], int(sys.argv[2])
def fio(path, kind):
    with open(path) as f:
        return json.load(f)["jobs"][0][kind]["bw_bytes"]
gb = lambda x: f"{x / 1e9:.3f}"
spread = lambda xs: f"{gb(min(xs))}-{gb(max(xs))}"
stow = []
for r in range(1, runs + 1):
    with open(f"{tmp}/stow-{r}.json") as f:
        stow.append(json.load(f))
print("## NVMe store, GB/s (10^9 bytes/s)\n")
print("fio `plain` is the issue's baseline (--ioengine=io_uring --direct=1);")
print("`fixed` adds --fixedbufs --registerfiles, which the store also uses.\n")
for kind, key, label in (("w", "write", "write_bytes_per_s"), ("r", "read", "read_bytes_per_s")):
    print(f"### {key}\n")
    print(f"| run | fio plain | fio fixed | stowage | stowage / plain | stowage / fixed |")
    print("|---|---|---|---|---|---|")
    cols = {"plain": [], "fixed": [], "stow": []}
    for r in range(1, runs + 1):
        p = fio(f"{tmp}/fio-plain-{kind}-{r}.json", key)
        x = fio(f"{tmp}/fio-fixed-{kind}-{r}.json", key)
        s_ = stow[r - 1][label]
        cols["plain"].append(p); cols["fixed"].append(x); cols["stow"].append(s_)
        print(f"| {r} | {gb(p)} | {gb(x)} | {gb(s_)} | {s_ / p:.3f} | {s_ / x:.3f} |")
    bp, bx, bs = max(cols["plain"]), max(cols["fixed"]), max(cols["stow"])
    print(f"\nBest of {runs}: stowage {gb(bs)}, fio plain {gb(bp)} (ratio **{bs / bp:.3f}**), "
          f"fio fixed {gb(bx)} (ratio **{bs / bx:.3f}**).  Spread: stowage {spread(cols['stow'])}, "
          f"fio plain {spread(cols['plain'])}, fio fixed {spread(cols['fixed'])}.")
    # Paired: each run's stowage against the fio runs beside it, so one
    # outlier on either side moves one ratio, not the verdict.
    mp = statistics.median(s_ / p for s_, p in zip(cols["stow"], cols["plain"]))
    mx = statistics.median(s_ / x for s_, x in zip(cols["stow"], cols["fixed"]))
    print(f"Median of the {runs} paired ratios: stowage / plain **{mp:.3f}**, "
          f"stowage / fixed **{mx:.3f}**.\n")
for name in ("swap", "swap-host"):
    with open(f"{tmp}/{name}.json") as f:
        s = json.load(f)
    print(f"\n## Swapper ({s['mode']}), best of 3 steps of each kind\n")
    print("| pipelined step | read alone | update alone | write alone | pipelined / slowest stage | pipelined / (read + write) |")
    print("|---|---|---|---|---|---|")
    # Host mode has no I/O, so no read + write to compare with.
    rw = s.get("pipelined_over_read_plus_write")
    rw = f"{rw:.3f}" if rw is not None else "n/a (no I/O)"
    print(f"| {s['pipelined_step_s']:.3f} s | {s['read_alone_s']:.3f} s | {s['update_alone_s']:.3f} s "
          f"| {s['write_alone_s']:.3f} s | **{s['pipelined_over_max_stage']:.3f}** "
          f"| {rw} |")
    print("\n```json\n" + json.dumps(s, indent=1) + "\n```")
PY
} >"$out"
echo "nvme.sh: wrote $out" >&2
cat "$out"
