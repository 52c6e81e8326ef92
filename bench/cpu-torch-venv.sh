#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench/cpu-torch-venv.sh: the newest PyTorch from PyPI, in bench/venv-torch
# (ignored), for bench/cpu-train.py's --peer-python: the peer the cpu
# backend's speed is quoted against, beside Debian's python3-torch.  PyPI's
# Linux wheel carries MKL and oneDNN (and CUDA, unused here): several GB.
#
#   bench/cpu-torch-venv.sh [VERSION]     e.g. 2.15.0; default the newest
set -eu

cd "$(dirname "$0")/.."
venv=bench/venv-torch
if [ ! -x "$venv/bin/pip" ]; then
	python3 -m venv "$venv"
	"$venv/bin/pip" install -q --upgrade pip
fi
spec=torch
[ $# -gt 0 ] && spec="torch==$1"
"$venv/bin/pip" install -q --upgrade "$spec" numpy
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'
