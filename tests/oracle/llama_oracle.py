# SPDX-License-Identifier: MIT
#
# tests/oracle/llama_oracle.py: the PyTorch oracle of the decoder runtime
# (executor/llama.h).  A LLaMA / Qwen2 decoder written here in plain torch
# after HF transformers' modeling_llama.py (LlamaRMSNorm, rotate_half,
# apply_rotary_pos_emb, repeat_kv, eager attention with a causal mask,
# LlamaMLP, _compute_llama3_parameters), run in float64 as the reference;
# the same model and tokens go through tests/llama-oracle-run (the C
# runtime) and the loss, the logits and every parameter gradient are
# compared.  Relative error of a tensor: max |c - ref| / max |ref|.
#
# usage: llama_oracle.py --runner PATH [--case NAME ...] [--list]
# exit 0: every case within tolerance; 1: a mismatch; 2: usage or a failed
# runner; 77: torch missing (the GTest wrapper skips).
import argparse
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("llama_oracle: torch not importable by %s" % sys.executable)
    sys.exit(77)

# Each case: a config (the runtime's field names), B, T and the tolerance.
# Sizes are tiny so that each case runs in well under a second; together
# they cover GQA, MHA, tied and untied heads, rope_theta 500000, llama3
# rope_scaling, qwen2 q/k/v biases, llama attention_bias / mlp_bias,
# B > 1, T not a power of two, T past one attention tile (128 queries),
# a loss split into chunks, and bf16 storage.
BASE = dict(hidden=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
            ffn=96, vocab=101, rope_theta=10000.0, rms_norm_eps=1e-6,
            rope_factor=0.0, rope_low_freq_factor=0.0,
            rope_high_freq_factor=0.0, rope_original_max_positions=0,
            qkv_bias=0, o_bias=0, mlp_bias=0, tied=0, dtype=0, chunk=0,
            threads=2)
CASES = {
    "gqa-untied": dict(B=2, T=7),
    "mha-tied-theta500k": dict(n_heads=4, n_kv_heads=4, tied=1,
                               rope_theta=500000.0, B=3, T=5),
    "llama3-rope-scaling": dict(hidden=64, n_heads=2, n_kv_heads=1,
                                head_dim=32, rope_theta=500000.0,
                                rope_factor=8.0, rope_low_freq_factor=1.0,
                                rope_high_freq_factor=4.0,
                                rope_original_max_positions=64, B=2, T=13),
    "qwen2-qkv-bias": dict(hidden=48, n_heads=6, n_kv_heads=2, head_dim=8,
                           ffn=80, qkv_bias=1, rope_theta=1000000.0,
                           rms_norm_eps=1e-5, B=2, T=9),
    "llama-all-biases-tied": dict(qkv_bias=1, o_bias=1, mlp_bias=1, tied=1,
                                  B=2, T=6),
    "long-seq-chunked-loss": dict(hidden=32, n_heads=2, n_kv_heads=1,
                                  head_dim=16, ffn=48, vocab=67, n_layers=1,
                                  B=2, T=150, chunk=37),
    "one-thread": dict(threads=1, B=1, T=11, vocab=300),
    "bf16": dict(dtype=1, B=2, T=7, tol=3e-2),
}
TOL_F32 = 1e-5


def config(name):
    c = dict(BASE)
    c.update(CASES[name])
    c.setdefault("tol", TOL_F32)
    return c


def param_shapes(c):
    """(name, shape) in the runner's order (tests/llama-oracle-run.c)."""
    h, f, V = c["hidden"], c["ffn"], c["vocab"]
    ad = c["n_heads"] * c["head_dim"]
    kd = c["n_kv_heads"] * c["head_dim"]
    out = [("embed", (V, h))]
    for l in range(c["n_layers"]):
        p = "layers.%d." % l
        out += [(p + "attn_norm", (h,)), (p + "wq", (ad, h)),
                (p + "wk", (kd, h)), (p + "wv", (kd, h))]
        if c["qkv_bias"]:
            out += [(p + "bq", (ad,)), (p + "bk", (kd,)), (p + "bv", (kd,))]
        out += [(p + "wo", (h, ad))]
        if c["o_bias"]:
            out += [(p + "bo", (h,))]
        out += [(p + "mlp_norm", (h,)), (p + "wg", (f, h)), (p + "wu", (f, h)),
                (p + "wd", (h, f))]
        if c["mlp_bias"]:
            out += [(p + "bg", (f,)), (p + "bu", (f,)), (p + "bd", (h,))]
    out += [("norm", (h,))]
    if not c["tied"]:
        out += [("lm_head", (V, h))]
    return out


def make_params(c, gen):
    ps = {}
    for name, shape in param_shapes(c):
        leaf = name.split(".")[-1]
        if leaf.endswith("norm"):
            t = 1.0 + 0.2 * torch.randn(shape, generator=gen)
        elif leaf == "embed":
            t = torch.randn(shape, generator=gen)
        elif leaf.startswith("b"):
            t = 0.2 * torch.randn(shape, generator=gen)
        else:  # weights (out, in): unit-variance outputs
            t = torch.randn(shape, generator=gen) / math.sqrt(shape[1])
        ps[name] = t.float()
    if c["dtype"] == 1:
        # The runtime stores bf16: the reference starts from the same
        # rounded weights, so only the arithmetic differs.
        ps = {k: v.bfloat16().float() for k, v in ps.items()}
    return ps


# ---- the reference, after HF transformers' modeling_llama.py -------------

def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def inv_freq(c):
    d = c["head_dim"]
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    if c["rope_factor"] == 0:
        return inv
    # _compute_llama3_parameters
    factor = c["rope_factor"]
    low, high = c["rope_low_freq_factor"], c["rope_high_freq_factor"]
    old = c["rope_original_max_positions"]
    low_freq_wavelen = old / low
    high_freq_wavelen = old / high
    wavelen = 2 * math.pi / inv
    inv_llama = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_llama)


def repeat_kv(x, n_rep):
    b, kvh, t, d = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(b, kvh, n_rep, t, d)
    return x.reshape(b, kvh * n_rep, t, d)


def reference(c, ps, tokens, targets):
    """Logits (n, V) and the mean cross-entropy, float64."""
    B, T = tokens.shape
    a, kvh, d = c["n_heads"], c["n_kv_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]
    x = ps["embed"][tokens]  # (B, T, h)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(c))
    emb = torch.cat((freqs, freqs), dim=-1)
    dt = ps["embed"].dtype  # float64, or float32 (train_oracle's peer)
    cos, sin = emb.cos().to(dt), emb.sin().to(dt)  # (T, d)
    mask = torch.full((T, T), float("-inf"), dtype=dt).triu(1)
    for l in range(c["n_layers"]):
        p = lambda s: ps["layers.%d.%s" % (l, s)]
        bias = lambda s: p(s) if ("layers.%d.%s" % (l, s)) in ps else None
        res = x
        hs = rms_norm(x, p("attn_norm"), eps)
        q = torch.nn.functional.linear(hs, p("wq"), bias("bq"))
        k = torch.nn.functional.linear(hs, p("wk"), bias("bk"))
        v = torch.nn.functional.linear(hs, p("wv"), bias("bv"))
        q = q.view(B, T, a, d).transpose(1, 2)
        k = k.view(B, T, kvh, d).transpose(1, 2)
        v = v.view(B, T, kvh, d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = repeat_kv(k, a // kvh)
        v = repeat_kv(v, a // kvh)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d) + mask
        w = torch.softmax(w, dim=-1)
        o = torch.matmul(w, v).transpose(1, 2).reshape(B, T, a * d)
        x = res + torch.nn.functional.linear(o, p("wo"), bias("bo"))
        res = x
        hs = rms_norm(x, p("mlp_norm"), eps)
        g = torch.nn.functional.linear(hs, p("wg"), bias("bg"))
        u = torch.nn.functional.linear(hs, p("wu"), bias("bu"))
        x = res + torch.nn.functional.linear(torch.nn.functional.silu(g) * u,
                                             p("wd"), bias("bd"))
    hs = rms_norm(x, ps["norm"], eps)
    head = ps["embed"] if c["tied"] else ps["lm_head"]
    logits = torch.nn.functional.linear(hs, head).reshape(B * T, -1)
    loss = torch.nn.functional.cross_entropy(logits, targets.reshape(-1))
    return logits, loss


# ---- the runner's files ------------------------------------------------------

def write_input(path, c, ps, tokens, targets):
    iv = [c["hidden"], c["n_layers"], c["n_heads"], c["n_kv_heads"],
          c["head_dim"], c["ffn"], c["vocab"],
          c["rope_original_max_positions"], c["qkv_bias"], c["o_bias"],
          c["mlp_bias"], c["tied"], tokens.shape[0], tokens.shape[1],
          c["dtype"], c["chunk"]]
    dv = [c["rope_theta"], c["rms_norm_eps"], c["rope_factor"],
          c["rope_low_freq_factor"], c["rope_high_freq_factor"], 0, 0, 0]
    with open(path, "wb") as f:
        f.write(b"STOWLLM1")
        f.write(struct.pack("<16q", *iv))
        f.write(struct.pack("<8d", *dv))
        f.write(struct.pack("<ii", c["threads"], 0))
        f.write(tokens.to(torch.int32).numpy().tobytes())
        f.write(targets.to(torch.int32).numpy().tobytes())
        for name, _ in param_shapes(c):
            f.write(ps[name].contiguous().numpy().astype("<f4").tobytes())


def read_output(path, c, n):
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"STOWOUT1":
        raise RuntimeError("%s: not a runner output" % path)
    loss = struct.unpack("<d", data[8:16])[0]
    arr = np.frombuffer(data[16:], dtype="<f4")
    V = c["vocab"]
    logits = torch.from_numpy(arr[: n * V].copy()).reshape(n, V)
    off, grads = n * V, {}
    for name, shape in param_shapes(c):
        m = int(np.prod(shape))
        grads[name] = torch.from_numpy(arr[off: off + m].copy()).reshape(shape)
        off += m
    if off != arr.size:
        raise RuntimeError("%s: %d floats left over" % (path, arr.size - off))
    return loss, logits, grads


def rel_err(a, ref):
    a, ref = a.double(), ref.double()
    scale = ref.abs().max().item()
    err = (a - ref).abs().max().item()
    return err / scale if scale > 0 else err


def run_case(name, runner, tmp):
    c = config(name)
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    ps = make_params(c, gen)
    B, T, V = c["B"], c["T"], c["vocab"]
    tokens = torch.randint(0, V, (B, T), generator=gen)
    targets = torch.randint(0, V, (B, T), generator=gen)
    if V > 2:  # a repeated token: the embedding's scatter-add sums it
        tokens[0, -1] = tokens[0, 0]
    inp = os.path.join(tmp, name + ".in")
    out = os.path.join(tmp, name + ".out")
    write_input(inp, c, ps, tokens, targets)
    r = subprocess.run([runner, inp, out], capture_output=True, text=True)
    if r.returncode != 0:
        print("%s: runner failed (%d): %s" % (name, r.returncode, r.stderr))
        return 2
    loss_c, logits_c, grads_c = read_output(out, c, B * T)

    ref = {k: v.double().requires_grad_(True) for k, v in ps.items()}
    logits, loss = reference(c, ref, tokens, targets)
    loss.backward()

    rows = [("loss", abs(loss_c - loss.item()) / abs(loss.item())),
            ("logits", rel_err(logits_c, logits.detach()))]
    rows += [(k, rel_err(grads_c[k], ref[k].grad)) for k, _ in param_shapes(c)]
    worst = max(rows, key=lambda r: r[1])
    bad = [r for r in rows if not (r[1] <= c["tol"])]
    print("# %s: B %d T %d dtype %s tol %.0e: worst %s %.3e" %
          (name, B, T, "bf16" if c["dtype"] else "fp32", c["tol"], worst[0],
           worst[1]))
    for k, e in rows:
        print("#   %-22s %.3e%s" % (k, e, "  <-- over tolerance" if e > c["tol"] or e != e else ""))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner")
    ap.add_argument("--case", action="append")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list:
        print("\n".join(CASES))
        return 0
    if not args.runner:
        ap.error("--runner is required")
    torch.set_num_threads(1)
    names = args.case or list(CASES)
    for n in names:
        if n not in CASES:
            print("llama_oracle: no case %r (--list)" % n)
            return 2
    rc = 0
    with tempfile.TemporaryDirectory(prefix="llama-oracle-") as tmp:
        for n in names:
            rc = max(rc, run_case(n, args.runner, tmp))
    return rc


if __name__ == "__main__":
    sys.exit(main())
