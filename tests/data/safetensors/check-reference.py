#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
#
# Loads a .safetensors file with the reference implementation and prints
# what it found as JSON: {"metadata": {...}, "tensors": {name: {"dtype",
# "shape", "values"}}}.  tests/test-safetensors.c runs it on a file our
# writer produced when STOW_SAFETENSORS_PYTHON names a Python that has
# torch and safetensors, and keeps the file and this output as
# writer-output.safetensors and writer-output.reference.json; without it,
# the test checks the writer against those.  Debian has python3-torch but
# no safetensors: make a venv with --system-site-packages and pip install
# safetensors.  Exit 77 when torch or safetensors is missing.
import json
import sys

try:
    import torch
    from safetensors import safe_open
except ImportError as e:
    print(f"reference reader unavailable: {e}", file=sys.stderr)
    sys.exit(77)

out = {"tensors": {}}
with safe_open(sys.argv[1], framework="pt") as f:
    out["metadata"] = f.metadata()
    for name in f.keys():
        t = f.get_tensor(name)
        out["tensors"][name] = {
            "dtype": str(t.dtype).replace("torch.", ""),
            "shape": list(t.shape),
            "values": t.to(torch.float64).flatten().tolist(),
        }
print(json.dumps(out))
