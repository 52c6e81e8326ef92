#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Installs the Debian packages stowage needs, and only those that are missing:
# each is checked with dpkg-query first, so a re-run costs a fraction of a
# second.  Works as root or through sudo.
set -euo pipefail

packages=(
  gcc libc6-dev pkg-config meson ninja-build python3
  libglib2.0-dev libglib2.0-dev-bin libjson-glib-dev libhwloc-dev libxxhash-dev
  liburing-dev libcairo2-dev
  libcurl4-openssl-dev  # models/hub.c: config.json by Hub id over HTTPS
  libopenblas-dev  # sgemm for the cpu backend's decoder where oneDNN has no brgemm (executor/gemm.c)
  libdnnl-dev  # oneDNN's matmul: the cpu backend's fp32 and bf16 (AMX) GEMMs on AVX-512 CPUs (executor/gemm.c)
  python3-torch python3-numpy  # the executor's PyTorch oracle (tests/oracle/)
  libglib2.0-dev-bin  # glib-compile-resources: the hw catalog is a GResource
  clang-format-14  # tests/check-format.sh: the one code format, version pinned
  libsoup-3.0-dev  # stowage serve: the HTTP server (serve/)
  chromium  # the browser tests: serve's page, the HTML reports (tests/)
  libopenmpi-dev openmpi-bin  # several ranks: executor/comm/mpi.c, mpirun in tests
)
# Optional tools the test setups and benchmarks use when present.
if [ "${STOW_DEPS_EXTRA:-}" = 1 ]; then
  packages+=(valgrind fio)
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  case "$status" in
    *"install ok installed"*) ;;
    *) missing+=("$p") ;;
  esac
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "deps: need root or sudo to install: ${missing[*]}" >&2
    exit 2
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
