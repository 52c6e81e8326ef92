#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
#
# Writes reference.safetensors with the reference implementation
# (safetensors.torch.save_file), once: tests/test-safetensors.c reads the
# committed file and checks every value below, so our reader is tested
# against the format as its authors write it.  Run with a Python that has
# torch and safetensors (Debian's python3-torch plus `pip install
# safetensors` in a venv made with --system-site-packages):
#   python make-reference.py reference.safetensors
import sys

import safetensors
import torch
from safetensors.torch import save_file

tensors = {
    "embed.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4) * 0.5,
    "norm.weight": torch.tensor([1.0, -2.0, 0.5, 65504.0, 0.0], dtype=torch.float16),
    "layer.bf16": torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.bfloat16),
    "ids": torch.tensor([1, -2, 3000000000], dtype=torch.int64),
    "mask": torch.tensor([[True, False, True], [False, False, True]]),
    "scalar": torch.tensor(7.25, dtype=torch.float32),
    "empty": torch.zeros((0, 4), dtype=torch.float32),
    "bytes": torch.tensor([0, 1, 254, 255], dtype=torch.uint8),
}
save_file(tensors, sys.argv[1],
          metadata={"format": "pt", "writer": "safetensors " + safetensors.__version__})
