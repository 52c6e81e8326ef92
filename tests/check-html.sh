#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# tests/check-html.sh: renders stowage's HTML reports in headless Chromium
# and checks that each page loads (Chromium exits 0, the DOM has the
# verdict, the charts and the formula tables) and yields a screenshot at a
# laptop's width.  Exits 77 (skip) without Chromium, which is optional
# (Debian: apt-get install chromium; STOW_DEPS_EXTRA=1 scripts/deps.sh).
#   tests/check-html.sh build/cli/stowage OUTDIR
# The screenshots in OUTDIR are for a person to look at.
set -euo pipefail

stowage=${1:?usage: check-html.sh STOWAGE OUTDIR}
out=${2:?usage: check-html.sh STOWAGE OUTDIR}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "check-html: no chromium on PATH; skipping" >&2
  exit 77
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)

declare -A cases=(
  [1gpu-cpu-offload]="mem llama-7b --gpus 1xA100-80GB --zero 1 --offload-optimizer cpu --engine deepspeed --recompute full"
  [8gpu-zero3]="fit llama-13b --gpus 8xA100-80GB --zero 3 --tp 1 --pp 1 --engine fsdp"
  [64gpu-tp8-pp4-vpp2]="fit llama-65b --gpus 64xH100-SXM --tp 8 --pp 4 --vpp 2 --zero 1 --engine megatron"
  [does-not-fit]="fit llama-65b --gpus 1xA100-80GB --offload-optimizer none --offload-params none"
)
fail=0
for name in "${!cases[@]}"; do
  html="$out/$name.html"
  # fit exits 1 for "does not fit": an answer, not a failure.
  # shellcheck disable=SC2086
  "$stowage" ${cases[$name]} --format html -o "$html" || [ $? -eq 1 ]
  flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars
         --user-data-dir="$out/.profile" --no-first-run)
  if ! timeout 120 "$browser" "${flags[@]}" --window-size=1366,2000 \
      --screenshot="$out/$name.png" "file://$html" >"$out/$name.log" 2>&1; then
    echo "check-html: $name: chromium failed (see $out/$name.log)" >&2
    fail=1
    continue
  fi
  timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$html" \
    >"$out/$name.dom" 2>>"$out/$name.log" || fail=1
  for want in 'class="verdict' 'Every term and its formula' '<td class="f">'; do
    grep -q "$want" "$out/$name.dom" || { echo "check-html: $name: DOM lacks $want" >&2; fail=1; }
  done
  if ! grep -q 'Chart not drawn' "$html"; then
    n=$(grep -o '<svg' "$out/$name.dom" | wc -l)
    [ "$n" -ge 1 ] || { echo "check-html: $name: no chart in the DOM" >&2; fail=1; }
  fi
  size=$(stat -c %s "$out/$name.png" 2>/dev/null || echo 0)
  [ "$size" -gt 20000 ] || { echo "check-html: $name: screenshot too small ($size B)" >&2; fail=1; }
  echo "check-html: $name: ok ($out/$name.png)"
done
rm -rf "$out/.profile"
exit $fail
