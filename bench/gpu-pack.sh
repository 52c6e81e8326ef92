#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench/gpu-pack.sh [BUILD]: packs what bench/gpu.sh runs on a GPU machine
# that has no build dependencies and no network: the stowage binary and the
# gpu suite's test programs from BUILD (default build/, configured where
# the CUDA toolkit is), stripped, with every shared library they load
# except the C and C++ runtimes the GPU machine has itself, into
# .gpu/bundle.tar.xz (ignored by git).  cuBLAS is not packed: the binary
# loads the GPU machine's own (llama-cuda.h), and the driver is its own.
# Carry .gpu to that machine and run bench/gpu.sh there.
set -eu
cd "$(dirname "$0")/.."
build=${1:-build}
if [ ! -x "$build/cli/stowage" ]; then
	echo "bench/gpu-pack.sh: $build/cli/stowage is not built (ninja -C $build)" >&2
	exit 2
fi
if ! ls "$build"/tests/test-gpu-* >/dev/null 2>&1; then
	echo "bench/gpu-pack.sh: $build has no gpu suite: configure it where the CUDA toolkit is" >&2
	exit 2
fi
stage=.gpu/stage
rm -rf .gpu
mkdir -p "$stage/build/cli" "$stage/build/tests" "$stage/build/bench" \
	"$stage/lib"
cp "$build/cli/stowage" "$stage/build/cli/"
cp "$build/bench/attention-gpu" "$stage/build/bench/"
for t in "$build"/tests/test-gpu-*; do
	[ -x "$t" ] && [ -f "$t" ] && cp "$t" "$stage/build/tests/"
done
strip "$stage"/build/cli/* "$stage"/build/tests/* "$stage"/build/bench/*
for exe in "$stage"/build/cli/* "$stage"/build/tests/* "$stage"/build/bench/*; do
	ldd "$exe" | awk '/=> \// { print $3 }'
done | sort -u | while read -r lib; do
	case "$(basename "$lib")" in
	libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | \
		libstdc++.so* | libgcc_s.so* | libcuda.so* | libcublas*) ;;
	*) cp -L "$lib" "$stage/lib/" ;;
	esac
done
tar -cJf .gpu/bundle.tar.xz -C "$stage" .
rm -rf "$stage"
du -h .gpu/bundle.tar.xz
