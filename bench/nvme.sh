#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# bench/nvme.sh: the NVMe store against fio on the same directory, file size,
# block size and queue depth (both O_DIRECT, sequential write then read),
# interleaved run by run so that both see the same machine load; then the
# optimizer swapper (pipelined step vs. each stage alone).  Writes
# bench/results/nvme-<date>.md with the machine, the exact commands, every
# run, the best and the spread.
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
fio_cmd() {
  echo fio --name="$1" --filename="$dir/fio.dat" --size="$fsz" --bs="$fbs" \
    --iodepth="$qd" --ioengine=io_uring --direct=1 --fixedbufs --registerfiles \
    --rw="$1" --numjobs=1 --output-format=json
}
stow_cmd="$stowage bench-io nvme --dir $dir --size $size --block-size $bs --queue-depth $qd --engine io_uring --json"

for r in $(seq 1 "$runs"); do
  # Alternate who goes first, so neither always meets a warmer device.
  if [ $((r % 2)) = 1 ]; then order="fio stow"; else order="stow fio"; fi
  for who in $order; do
    if [ "$who" = fio ]; then
      rm -f "$dir/fio.dat"
      $(fio_cmd write) >"$tmp/fio-w-$r.json"
      $(fio_cmd read) >"$tmp/fio-r-$r.json"
      rm -f "$dir/fio.dat"
    else
      $stow_cmd >"$tmp/stow-$r.json"
    fi
  done
  echo "nvme.sh: run $r of $runs done" >&2
done

swap_cmd="$stowage bench-io swapper --dir $dir --size $swap_size --shard-size $swap_shard --block-size $bs --queue-depth $qd --repeat 3 --json"
$swap_cmd >"$tmp/swap.json"
swap_host_cmd="$stowage bench-io swapper --mode host --size $swap_size --shard-size $swap_shard --repeat 3 --json"
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
  echo "$(fio_cmd write)"
  echo "$(fio_cmd read)"
  echo "$stow_cmd"
  echo "$swap_cmd"
  echo "$swap_host_cmd"
  echo '```'
  echo
  python3 - "$tmp" "$runs" <<'PY'
import json, sys, os
tmp, runs = sys.argv[1], int(sys.argv[2])
def fio(path, kind):
    with open(path) as f:
        return json.load(f)["jobs"][0][kind]["bw_bytes"]
rows = []
for r in range(1, runs + 1):
    fw = fio(f"{tmp}/fio-w-{r}.json", "write")
    fr = fio(f"{tmp}/fio-r-{r}.json", "read")
    with open(f"{tmp}/stow-{r}.json") as f:
        s = json.load(f)
    rows.append((r, fw, s["write_bytes_per_s"], fr, s["read_bytes_per_s"]))
gb = lambda x: f"{x / 1e9:.3f}"
print("## NVMe store, GB/s (10^9 bytes/s)\n")
print("| run | fio write | stowage write | ratio | fio read | stowage read | ratio |")
print("|---|---|---|---|---|---|---|")
for r, fw, sw, fr, sr in rows:
    print(f"| {r} | {gb(fw)} | {gb(sw)} | {sw / fw:.3f} | {gb(fr)} | {gb(sr)} | {sr / fr:.3f} |")
col = lambda i: [row[i] for row in rows]
bfw, bsw, bfr, bsr = max(col(1)), max(col(2)), max(col(3)), max(col(4))
spread = lambda xs: f"{gb(min(xs))}-{gb(max(xs))}"
print(f"\nBest of each: write {gb(bsw)} vs fio {gb(bfw)} = **{bsw / bfw:.3f}**; "
      f"read {gb(bsr)} vs fio {gb(bfr)} = **{bsr / bfr:.3f}**.")
print(f"Spread over runs: fio write {spread(col(1))}, stowage write {spread(col(2))}, "
      f"fio read {spread(col(3))}, stowage read {spread(col(4))} GB/s.")
rw = [row[2] / row[1] for row in rows]
rr = [row[4] / row[3] for row in rows]
print(f"Per-run ratios: write {min(rw):.3f}-{max(rw):.3f}, read {min(rr):.3f}-{max(rr):.3f}.")
for name in ("swap", "swap-host"):
    with open(f"{tmp}/{name}.json") as f:
        s = json.load(f)
    print(f"\n## Swapper ({s['mode']}), best of 3 steps of each kind\n")
    print("| pipelined step | read alone | update alone | write alone | pipelined / slowest stage | pipelined / (read + write) |")
    print("|---|---|---|---|---|---|")
    print(f"| {s['pipelined_step_s']:.3f} s | {s['read_alone_s']:.3f} s | {s['update_alone_s']:.3f} s "
          f"| {s['write_alone_s']:.3f} s | **{s['pipelined_over_max_stage']:.3f}** "
          f"| {s['pipelined_over_read_plus_write']:.3f} |")
    print("\n```json\n" + json.dumps(s, indent=1) + "\n```")
PY
} >"$out"
echo "nvme.sh: wrote $out" >&2
cat "$out"
