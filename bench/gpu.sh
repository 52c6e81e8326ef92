#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench/gpu.sh: every check that needs a GPU, in one call that fits in ten
# minutes, writing its results under one directory ($OUT when set, else
# bench/results/gpu-<date>/): the device, driver and toolkit; the gpu test
# suite (the GPU runtime's kernels and `stowage train --backend cuda`
# against the cpu backend, and against PyTorch in float64); then attention
# forward and backward on tensor and CUDA cores (bench/attention-gpu.c);
# training tokens/s against PyTorch eager (bench/gpu-train.py) in bf16 and
# fp32, with the MFU and a trace; ZeRO-Offload's step against its bound
# (bench/gpu-offload.py); each step's kernels against PyTorch's
# (bench/gpu-profile.py, Nsight Compute); and the cuda row of
# bench/load-residue.py (the memory model's PEFT calibration).  Name the
# parts to run (suite, bench, offload, profile, residue), or all.
#
# The GPU machine lent to this project (one H100 or H200, 16 cores, no
# network, a Python with PyTorch, no build dependencies) runs what
# bench/gpu-pack.sh packed on the build machine:
#   here:   ./build.sh && bench/gpu-pack.sh build      # .gpu/bundle.tar.xz
#   there:  carry .gpu; sh bench/gpu.sh [suite bench offload profile residue|all]
#           (default all)
# On a machine that builds stowage itself with CUDA, it runs build/'s
# binaries instead.  Measurements that need the peers' wheels
# (bench/peft-ds-offload.py, bench/torchtune-8bit.py: bench/gpu-wheels.sh)
# are not run here: they need their own call for the carry limit.
set -u
cd "$(dirname "$0")/.." || exit 2
root=$(pwd)
what=" ${*:-all} "
want() {
	case "$what" in *" $1 "* | *" all "*) return 0 ;; esac
	return 1
}
out=${OUT:-$root/bench/results/gpu-$(date -u +%Y%m%d-%H%M)}
mkdir -p "$out"
log="$out/gpu.log"
: >"$log"
say() { echo "$*" | tee -a "$log"; }

if [ -f .gpu/bundle.tar.xz ]; then
	tar -xJf .gpu/bundle.tar.xz -C .gpu
	bin=$root/.gpu/build
	LD_LIBRARY_PATH=$root/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
	bin=$root/build
fi
# cuBLAS: the machine's own (the toolkit's, or PyTorch's wheel's).
cublas=$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublas.so.1[0-9]*' \
	2>/dev/null | head -1)
if [ -n "$cublas" ]; then
	LD_LIBRARY_PATH=$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export LD_LIBRARY_PATH
export STOWAGE="$bin/cli/stowage" G_TEST_SRCDIR="$root/tests"

{
	echo "# device"
	date -u
	nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
		--format=csv 2>&1
	nvcc --version 2>&1 | tail -2
	echo "cuBLAS: ${cublas:-not found}"
	python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1
	uname -r
	nproc
} >"$out/device.txt"
tee -a "$log" <"$out/device.txt"
"$STOWAGE" version 2>&1 | tee -a "$log"

status=0
if want suite; then
	# GPU_TESTS: which test programs (default every test-gpu-*);
	# GPU_TEST_ARGS: more arguments for each (e.g. "-s /gpu/train/oracle").
	for t in "$bin"/tests/${GPU_TESTS:-test-gpu-*}; do
		[ -x "$t" ] || continue
		say "## $(basename "$t")"
		# shellcheck disable=SC2086
		timeout "${GPU_TEST_TIMEOUT:-300}" "$t" --tap -k ${GPU_TEST_ARGS:-} \
			>>"$log" 2>&1 || status=1
	done
	grep -E '^(not ok|ok|# )' "$log" | grep -v '^# Start\|^# End' |
		tail -80 >"$out/suite.txt"
fi
if want offload; then
	say "## gpu-offload"
	timeout "${GPU_OFFLOAD_TIMEOUT:-200}" python3 bench/gpu-offload.py \
		--stowage "$STOWAGE" --out "$out" >>"$log" 2>&1 || status=1
fi
if want profile; then
	say "## gpu-profile"
	timeout 200 python3 bench/gpu-profile.py --stowage "$STOWAGE" \
		--out "$out" >>"$log" 2>&1 || status=1
fi
if want bench; then
	say "## attention-gpu"
	timeout 60 "$bin/bench/attention-gpu" >"$out/attention.txt" 2>&1 ||
		status=1
	cat "$out/attention.txt" >>"$log"
	for p in ${GPU_BENCH_PRECISIONS:-bf16 fp32}; do
		say "## gpu-train $p"
		timeout 200 python3 bench/gpu-train.py --stowage "$STOWAGE" \
			--out "$out" --precision "$p" >>"$log" 2>&1 || status=1
	done
fi
if want residue; then
	say "## load-residue (cuda row)"
	touch "$out/.mark"
	timeout 120 python3 bench/load-residue.py --layers 6 >>"$log" 2>&1 ||
		status=1
	find bench/results -name 'load-residue-*' -newer "$out/.mark" \
		-exec cp {} "$out/load-residue.md" \;
	rm -f "$out/.mark"
fi
# What a reader (or a device call's output tail) needs first.
say "## summary"
failing=$(grep -h '^not ok' "$log")
say "${failing:-no failing case}"
for f in "$out"/gpu-train-*.md "$out"/gpu-offload.md; do
	[ -f "$f" ] || continue
	grep -h 'x (above 1\|goal <= 1.1\|^| optimizer\|^| stowage\|^| PyTorch' \
		"$f" | tee -a "$log"
done
[ -f "$out/attention.txt" ] && grep -h 'tensor cores  ' "$out/attention.txt" | tee -a "$log"
say "gpu.sh: exit $status; results in $out"
exit $status
