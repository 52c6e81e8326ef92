# SPDX-License-Identifier: MIT
#
# bench/benchlib.py: what the Python scripts in bench/ share: the machine
# and time a result is stamped with, and printing it and writing it under
# bench/results/ whole or not at all.

import datetime
import json
import os
import socket
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def stamp():
    """The short host name and the UTC time a run is recorded under."""
    return (socket.gethostname().split(".")[0],
            datetime.datetime.now(datetime.timezone.utc))


def report(stem, host, now, lines, save=True):
    """Print the result's @lines and, when @save, write them to
    bench/results/<stem>-<host>-<date>.md through a temporary file, so a
    failed run leaves no partial result."""
    text = "\n".join(lines)
    print(text)
    if not save:
        return
    out = os.path.join(HERE, "results", f"{stem}-{host}-{now:%Y%m%d-%H%M}.md")
    with open(out + ".tmp", "w") as f:
        f.write(text)
    os.replace(out + ".tmp", out)
    print(f"wrote {out}")


def read_safetensors(path, device="cpu"):
    """The tensors of a safetensors file (F32 or BF16) as fp32 torch
    tensors on @device, by name."""
    import torch
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        buf = bytearray(data[8 + n + a:8 + n + b])
        dt = torch.float32 if t["dtype"] == "F32" else torch.bfloat16
        out[name] = torch.frombuffer(buf, dtype=dt).reshape(
            t["shape"]).to(device=device, dtype=torch.float32)
    return out
