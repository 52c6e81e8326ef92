#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench/engine-check-venv.sh: the venv bench/engine-check.py runs in,
# bench/venv-ds (ignored), from PyPI: PyTorch (Linux wheels carry CUDA
# libraries, several GB; only the CPU is used), transformers (the model
# DeepSpeed trains is LlamaForCausalLM from stowage's checkpoint) and
# DeepSpeed 0.19.8, published as source only and built here with no ops:
# it compiles its CPU Adam and CPU fused Adam on first use (with g++ and
# ninja, into ~/.cache/torch_extensions); and megatron-core, for
# Megatron-LM's scheduler.  Takes a while; not part of the test suite.
#
#   bench/engine-check-venv.sh && bench/venv-ds/bin/python bench/engine-check.py
set -eu

cd "$(dirname "$0")/.."
venv=bench/venv-ds
if [ ! -x "$venv/bin/pip" ]; then
	python3 -m venv "$venv"
fi
pip="$venv/bin/pip"
"$pip" install -q --upgrade pip setuptools wheel
"$pip" install -q torch==2.15.0 numpy transformers==5.24.0 safetensors==0.8.0
# DeepSpeed's setup.py imports torch: built against the one above.
DS_BUILD_OPS=0 "$pip" install -q --no-build-isolation deepspeed==0.19.8
# megatron-core for its OptimizerParamScheduler alone (pure Python; its
# CUDA extras are not needed for that).
"$pip" install -q --no-deps megatron-core==0.16.1
"$venv/bin/python" -c 'import deepspeed, torch, transformers
print("deepspeed", deepspeed.__version__, "torch", torch.__version__,
      "transformers", transformers.__version__)'
