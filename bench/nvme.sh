#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# bench/nvme.sh: the NVMe store against fio, like for like (issue 26), then
# the optimizer swapper's step against its bound.
#
# Like for like: the same directory, file size, block size, queue depth,
# O_DIRECT, io_uring with registered buffers and files on both sides
# (fio --fixedbufs --registerfiles), a freshly preallocated file for each
# write pass (the store fallocates at prepare; fio --fallocate=native on a
# removed file), random data (fio's default; the store's bench fills its
# buffers with xorshift), and the same kind of buffer memory: when stowage's
# buffers got 2 MiB pages fio runs with --mem=mmaphuge (hugetlb 2 MiB pages:
# fio has no THP option), else with its default malloc (4 KiB pages where THP
# is "madvise" or "never").  The page kind of both sides is printed.  The two
# run alternately, run by run, who goes first alternating, and the verdict is
# the median of the per-run (paired) ratios.
#
# Usage: bench/nvme.sh [DIR] ; knobs by environment:
#   SIZE (2GiB) BS (1MiB) QD (32) RUNS (7)
#   PAGES ("auto off"): the stowage --huge-pages kinds to measure, each a full
#     set of alternating runs (auto takes THP where the kernel offers it;
#     "hugetlb" needs reserved pages)
#   HUGETLB_RESERVE (0): as root, raise /proc/sys/vm/nr_hugepages to at least
#     this many pages for the run (fio's --mem=mmaphuge needs them) and put
#     the old value back at exit; 0 leaves the system alone
#   SWAP_SIZE (1GiB) SWAP_SHARD (64MiB) SWAP_RUNS (5) STOWAGE
#   (build/cli/stowage) TAG (vm): the result file's machine tag
# Writes bench/results/nvme-$TAG-YYYYMMDD-HHMM.md.  fio is installed with
# apt-get when missing (a benchmark peer, never a build dependency).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
dir=${1:-/var/tmp/stowage-bench}
size=${SIZE:-2GiB}
bs=${BS:-1MiB}
qd=${QD:-32}
runs=${RUNS:-7}
pages=${PAGES:-auto off}
reserve=${HUGETLB_RESERVE:-0}
stowage=${STOWAGE:-$root/build/cli/stowage}
swap_size=${SWAP_SIZE:-1GiB}
swap_shard=${SWAP_SHARD:-64MiB}
swap_runs=${SWAP_RUNS:-5}
tag=${TAG:-vm}

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
old_nr=""
cleanup() {
  rm -rf "$tmp"
  rm -f "$dir/fio.dat"
  if [ -n "$old_nr" ]; then echo "$old_nr" >/proc/sys/vm/nr_hugepages; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if [ "$reserve" -gt 0 ]; then
  cur=$(cat /proc/sys/vm/nr_hugepages)
  if [ "$cur" -lt "$reserve" ]; then
    old_nr=$cur
    echo "$reserve" >/proc/sys/vm/nr_hugepages \
      || { echo "nvme.sh: cannot reserve hugetlb pages (root?)" >&2; exit 2; }
  fi
fi
hp_free() { awk '/HugePages_Free/ {print $2}' /proc/meminfo; }

fsz=$(fio_size "$size")
fbs=$(fio_size "$bs")
thp=$(sed -E 's/.*\[([a-z]+)\].*/\1/' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo never)
# fio's buffer: QD blocks; in 2 MiB pages, rounded up, plus one.
bs_bytes=$(numfmt --from=iec-i "${bs%B}" 2>/dev/null || echo 1048576)
fio_pages=$(( (qd * bs_bytes + 2097151) / 2097152 + 1 ))

# $1: write or read; $2: malloc or mmaphuge
fio_cmd() {
  echo fio --name="$1" --filename="$dir/fio.dat" --size="$fsz" --bs="$fbs" \
    --iodepth="$qd" --ioengine=io_uring --direct=1 --fixedbufs --registerfiles \
    --fallocate=native --mem="$2" --rw="$1" --numjobs=1 --output-format=json
}
stow_cmd() {
  echo "$stowage" bench nvme --dir "$dir" --size "$size" --block-size "$bs" \
    --queue-depth "$qd" --engine io_uring --huge-pages "$1" --json
}

: >"$tmp/configs"
for p in $pages; do
  # What stowage's pool gets with this kind: fio gets the same size of page.
  kind=$("$stowage" hw --huge-pages "$p" --json | python3 -c \
    'import json,sys; print(json.load(sys.stdin)["host_pages"]["page_kind"])')
  if [ "$kind" = small ]; then
    mem=malloc
    fio_kind="small (malloc; THP $thp)"
    [ "$thp" = always ] && fio_kind="malloc under THP always: may be THP"
  elif [ "$(hp_free)" -ge "$fio_pages" ]; then
    mem=mmaphuge
    fio_kind="hugetlb (2 MiB)"
  else
    mem=malloc
    fio_kind="small (malloc): no $fio_pages free hugetlb pages for --mem=mmaphuge (set HUGETLB_RESERVE)"
  fi
  echo "$p $mem $kind|$fio_kind" >>"$tmp/configs"
  for r in $(seq 1 "$runs"); do
    if [ $((r % 2)) = 1 ]; then order="fio stow"; else order="stow fio"; fi
    for who in $order; do
      if [ "$who" = fio ]; then
        rm -f "$dir/fio.dat"
        $(fio_cmd write $mem) >"$tmp/fio-$p-w-$r.json"
        $(fio_cmd read $mem) >"$tmp/fio-$p-r-$r.json"
        rm -f "$dir/fio.dat"
      else
        $(stow_cmd "$p") >"$tmp/stow-$p-$r.json"
      fi
    done
    echo "nvme.sh: pages $p: run $r of $runs done" >&2
  done
done

swap_cmd() {
  echo "$stowage" bench swapper --dir "$dir" --size "$swap_size" \
    --shard-size "$swap_shard" --block-size "$bs" --queue-depth "$qd" \
    --huge-pages "$1" --repeat 3 --json
}
# Swapper runs alternate between the page kinds too.
for r in $(seq 1 "$swap_runs"); do
  for p in $pages; do
    $(swap_cmd "$p") >"$tmp/swap-$p-$r.json"
  done
  echo "nvme.sh: swapper run $r of $swap_runs done" >&2
done
swap_host_cmd="$stowage bench swapper --mode host --size $swap_size --shard-size $swap_shard --repeat 3 --json"
$swap_host_cmd >"$tmp/swap-host.json"

mkdir -p "$root/bench/results"
out="$root/bench/results/nvme-$tag-$(date -u +%Y%m%d-%H%M).md"
{
  echo "# NVMe store vs fio, like for like, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "## Machine"
  echo
  echo '```'
  echo "kernel: $(uname -r)"
  echo "nproc: $(nproc)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "memory: $(free -h | awk '/Mem:/ {print $2}')"
  echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
  echo "hugetlb: $(grep -E 'HugePages_(Total|Free)' /proc/meminfo | tr -s ' ' | tr '\n' ' ')"
  echo "fio: $(fio --version)"
  echo "stowage: $("$stowage" --version | tr '\n' ' ')"
  echo "git: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo "\$ df -T $dir"
  df -T "$dir"
  echo '```'
  echo
  echo "## Commands ($runs runs per page kind, fio and stowage alternating, who goes first alternating)"
  echo
  echo '```'
  while read -r p mem _; do
    echo "# pages $p"
    echo "$(stow_cmd "$p")"
    echo "$(fio_cmd write "$mem")"
    echo "$(fio_cmd read "$mem")"
  done <"$tmp/configs"
  for p in $pages; do echo "$(swap_cmd "$p")   # x $swap_runs"; done
  echo "$swap_host_cmd"
  echo '```'
  echo
  python3 - "$tmp" "$runs" "$swap_runs" "$pages" <<'PY'
import json, statistics, sys
tmp, runs, swap_runs, pages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
gb = lambda x: f"{x / 1e9:.3f}"
def load(path):
    with open(path) as f:
        return json.load(f)
configs = {}
with open(f"{tmp}/configs") as f:
    for line in f:
        p, mem, rest = line.rstrip("\n").split(" ", 2)
        configs[p] = (mem, rest.split("|"))
print("## NVMe store, GB/s (10^9 bytes/s)\n")
summary = []
for p in pages:
    mem, (probe_kind, fio_kind) = configs[p]
    stow = [load(f"{tmp}/stow-{p}-{r}.json") for r in range(1, runs + 1)]
    kinds = sorted({s["page_kind"] for s in stow})
    print(f"### stowage --huge-pages {p}: stowage's buffers {', '.join(kinds)}; fio --mem={mem}: {fio_kind}\n")
    notes = sorted({s.get("page_note") for s in stow if s.get("page_note")})
    for n in notes:
        print(f"stowage's note: {n}\n")
    for kind, key, label in (("w", "write", "write_bytes_per_s"), ("r", "read", "read_bytes_per_s")):
        print(f"{key}:\n")
        print("| run | fio | stowage | stowage / fio |")
        print("|---|---|---|---|")
        ratios, fs, ss = [], [], []
        for r in range(1, runs + 1):
            fbw = load(f"{tmp}/fio-{p}-{kind}-{r}.json")["jobs"][0][key]["bw_bytes"]
            sbw = stow[r - 1][label]
            ratios.append(sbw / fbw); fs.append(fbw); ss.append(sbw)
            print(f"| {r} | {gb(fbw)} | {gb(sbw)} | {sbw / fbw:.3f} |")
        med = statistics.median(ratios)
        print(f"\nMedian of the {runs} paired ratios: **{med:.3f}** (range {min(ratios):.3f}-{max(ratios):.3f}); "
              f"medians: stowage {gb(statistics.median(ss))}, fio {gb(statistics.median(fs))} GB/s.\n")
        summary.append((p, ", ".join(kinds), mem, key, med, statistics.median(ss), statistics.median(fs)))
print("### Summary\n")
print("| --huge-pages | stowage pages | fio --mem | direction | median stowage / fio | stowage GB/s | fio GB/s |")
print("|---|---|---|---|---|---|---|")
for p, k, mem, key, med, s, f in summary:
    print(f"| {p} | {k} | {mem} | {key} | **{med:.3f}** | {gb(s)} | {gb(f)} |")
print()
print("## Swapper: the pipelined step against its bound\n")
print("Bound (core/drives.h): one device, whose reads and writes share a queue: "
      "max (read alone + write alone, update alone), each stage measured by the "
      "serial step of the same run; best of 3 steps of each kind per run.\n")
print("| --huge-pages | run | pages | step | read | write | update | bound | step / bound |")
print("|---|---|---|---|---|---|---|---|---|")
sw_summary = []
for p in pages:
    rs = []
    for r in range(1, swap_runs + 1):
        s = load(f"{tmp}/swap-{p}-{r}.json")
        rs.append(s["step_over_bound"])
        print(f"| {p} | {r} | {s['page_kind']} | {s['pipelined_step_s']:.3f} s | {s['read_alone_s']:.3f} s "
              f"| {s['write_alone_s']:.3f} s | {s['update_alone_s']:.3f} s | {s['bound_s']:.3f} s | {s['step_over_bound']:.3f} |")
    sw_summary.append((p, statistics.median(rs), min(rs), max(rs)))
print()
for p, med, lo, hi in sw_summary:
    print(f"- `--huge-pages {p}`: median step / bound **{med:.3f}** (range {lo:.3f}-{hi:.3f}, {swap_runs} runs)")
h = load(f"{tmp}/swap-host.json")
print(f"- host mode (no I/O): step {h['pipelined_step_s']:.3f} s, update alone {h['update_alone_s']:.3f} s, "
      f"step / bound {h['step_over_bound']:.3f}")
PY
} >"$out"
echo "nvme.sh: wrote $out" >&2
cat "$out"
