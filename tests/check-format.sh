#!/bin/sh
# SPDX-License-Identifier: MIT
#
# tests/check-format.sh SRCDIR: every C source and header of the tree is
# as clang-format leaves it (.clang-format), so the format cannot drift.
# The version is pinned: Debian 12's clang-format 14 (scripts/deps.sh
# installs clang-format-14); other versions break some lines otherwise.
# The CUDA sources are not checked: clang-format 14 splits their <<< >>>
# launches inside macro arguments.  Exit 0 all formatted, 1 not (the
# files and the command that fixes them are listed), 77 no clang-format-14.
set -eu
src=$1
cf=$(command -v clang-format-14 || true)
if [ -z "$cf" ]; then
  echo "clang-format-14 not found (scripts/deps.sh installs it)"
  exit 77
fi
cd "$src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  files=$(git ls-files '*.c' '*.h')
else
  files=$(find . -path ./build -prune -o -path './build-*' -prune -o \
    \( -name '*.c' -o -name '*.h' \) -print)
fi
bad=""
for f in $files; do
  "$cf" --dry-run -Werror "$f" >/dev/null 2>&1 || bad="$bad $f"
done
if [ -n "$bad" ]; then
  echo "not formatted as .clang-format says:$bad"
  echo "fix: clang-format-14 -i$bad"
  exit 1
fi
echo "$(echo $files | wc -w) files formatted"
