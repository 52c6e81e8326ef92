#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# stowage's set-up in one command (see README, "Quick start"):
#   ./build.sh          install missing Debian packages, build, and answer
#                       "stowage fit llama-65b --gpus 8xA100-80GB"
#   ./build.sh test     the same set-up, then every test suite
#   ./build.sh asan     build with AddressSanitizer+UBSan in build-asan/, run tests
#   ./build.sh valgrind run the tests under valgrind
# Under CI=true warnings are errors.  Re-running with nothing changed is fast.
set -euo pipefail
cd "$(dirname "$0")"

what=${1:-run}
build=${BUILD:-build}
werror=()
[ "${CI:-}" = true ] && werror=(--werror)

scripts/deps.sh

configure() { # DIR [MESON OPTIONS...]
  local dir=$1
  shift
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "${werror[@]}" "$@" >"$dir.setup.log" 2>&1 || {
      cat "$dir.setup.log" >&2
      exit 2
    }
    sed -n '/^stowage /,$p' "$dir.setup.log" | grep -v '^Found ninja' >&2
  fi
  ninja -C "$dir" >/dev/null || ninja -C "$dir"
}

jobs=$(nproc 2>/dev/null || echo 2)
case "$what" in
  run)
    configure "$build"
    exe="$build/cli/stowage"
    echo "\$ stowage fit llama-65b --gpus 8xA100-80GB"
    "$exe" fit llama-65b --gpus 8xA100-80GB
    ;;
  test)
    configure "$build"
    meson test -C "$build" --print-errorlogs --num-processes "$jobs"
    ;;
  asan)
    configure "$build-asan" -Db_sanitize=address,undefined -Db_lundef=false
    meson test -C "$build-asan" --setup asan --print-errorlogs \
      --num-processes "$jobs" --no-suite slow
    ;;
  valgrind)
    configure "$build"
    meson test -C "$build" --setup valgrind --print-errorlogs \
      --num-processes "$jobs" --no-suite slow --no-suite gpu
    ;;
  *)
    echo "usage: ./build.sh [run|test|asan|valgrind]" >&2
    exit 2
    ;;
esac
