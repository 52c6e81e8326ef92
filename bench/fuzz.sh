#!/bin/bash
# SPDX-License-Identifier: MIT
#
# bench/fuzz.sh: the long mode of tests/test-fuzz.c (issue 24): the same
# mutation fuzzer over HF config.json, cluster files, plan files and the
# numeric flags, with many more cases and several seeds, each case in a
# forked child (STOW_FUZZ_FORK=1) so that a crash ends one case, not the
# run.  Every failure is printed with the seed, the command and the input
# that reproduce it; the summary goes to bench/results/fuzz-<host>-<date>.md.
#
#   ninja -C build && bench/fuzz.sh [CASES_PER_PARSER [SEEDS...]]
#   BUILD=build-asan bench/fuzz.sh 20000 1 2 3     # under the sanitizers
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
BUILD=${BUILD:-build}
TEST="$ROOT/$BUILD/tests/test-fuzz"
CASES=${1:-20000}
shift || true
SEEDS=("$@")
[ ${#SEEDS[@]} -eq 0 ] && SEEDS=(1 2 3 4)
[ -x "$TEST" ] || { echo "fuzz: build $TEST first (ninja -C $BUILD)" >&2; exit 2; }

host=$(hostname -s)
stamp=$(date -u +%Y%m%d-%H%M)
out="$HERE/results/fuzz-$host-$stamp.md"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export G_TEST_SRCDIR="$ROOT/tests" STOW_FUZZ_FORK=1 STOW_FUZZ_CASES="$CASES"
# The sanitizers' settings of the suite's asan setup (tests/meson.build).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

status=0
{
  echo "# stowage fuzz: $CASES cases per parser, seeds ${SEEDS[*]}"
  echo
  echo "\`BUILD=$BUILD bench/fuzz.sh $CASES ${SEEDS[*]}\` on $host, $(date -u +%Y-%m-%d)," \
       "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')."
  echo
} >"$out"
for seed in "${SEEDS[@]}"; do
  echo "fuzz: seed $seed, $CASES cases per parser" >&2
  if ! STOW_FUZZ_SEED=$seed "$TEST" --tap -k >"$log" 2>&1; then
    status=1
  fi
  {
    echo "## seed $seed"
    echo
    grep -E '^# .*cases in|^not ok' "$log" | sed 's/^# /- /; s/^not ok/- not ok/'
    echo
  } >>"$out"
  # Failures, each with what reproduces it.
  grep -A8 -E 'FUZZ (FAILURE|CRASH)' "$log" >&2 || true
done
echo "fuzz: summary in $out" >&2
exit $status
