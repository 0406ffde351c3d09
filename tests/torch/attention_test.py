"""dtrain's CausalSelfAttention against PyTorch (CTest label torch).

    /usr/bin/python3 attention_test.py PATH/TO/dtrain_attention_tool

The same weights, input and output gradient in both: nanoGPT's layer written with
torch.nn.functional.scaled_dot_product_attention(is_causal=True) (torch < 2.0: the masked softmax of
torch_gpt_peer.py's Attention) gives dtrain's output, input
gradient and parameter gradients within 1e-5 of the largest magnitude, at T = 5 (one causal block)
and T = 130 (three). Exit 77 (CTest: skipped) with the reason when torch cannot be imported.
"""
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 - any import failure means: skip, saying why
    print(f"skipped: /usr/bin/python3 cannot import torch: {e}")
    sys.exit(77)

TOOL = sys.argv[1]
failures = []


SDPA = getattr(F, "scaled_dot_product_attention", None)  # torch >= 2.0; Debian 12 has 1.13


def torch_attention(x, wa, ba, wp, bp, H):
    """nanoGPT's CausalSelfAttention.forward: the flash path, or its masked softmax (the peer's)."""
    B, T, C = x.shape
    q, k, v = F.linear(x, wa, ba).split(C, dim=2)
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
    if SDPA is not None:
        y = SDPA(q, k, v, is_causal=True)
    else:
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
    return F.linear(y.transpose(1, 2).contiguous().view(B, T, C), wp, bp)


def compare(B, T, C, H, seed):
    g = torch.Generator().manual_seed(seed)
    u = lambda *shape: (torch.rand(*shape, generator=g, dtype=torch.float64) - 0.5).float()  # noqa: E731
    wa, ba, wp, bp = u(3 * C, C), u(3 * C), u(C, C), u(C)  # U(-0.5, 0.5): scores far from uniform
    x, dy = 2 * u(B, T, C), 2 * u(B, T, C)
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "in"), os.path.join(d, "out")
        with open(src, "wb") as f:
            f.write(np.array([B, T, C, H], dtype="<i8").tobytes())
            for t in (wa, ba, wp, bp, x, dy):
                f.write(t.numpy().astype("<f4").tobytes())
        r = subprocess.run([TOOL, src, dst], capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"tool failed: {r.stderr.strip()}")
            return
        got = np.fromfile(dst, dtype="<f4")
    params = [t.clone().requires_grad_(True) for t in (wa, ba, wp, bp)]
    xr = x.clone().requires_grad_(True)
    y = torch_attention(xr, *params, H)
    y.backward(dy)
    want = [("output", y.detach()), ("input gradient", xr.grad)] + [
        (name + " gradient", p.grad) for name, p in zip(("c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias"), params)]
    at = 0
    for what, t in want:
        n = t.numel()
        mine = torch.from_numpy(got[at:at + n].copy()).view(t.shape)
        at += n
        err = (mine - t).abs().max().item() / max(1e-3, t.abs().max().item())
        ok = err < 1e-5
        print(("ok   " if ok else "FAIL ") + f"T={T}: {what} within {err:.2e} of the largest")
        if not ok:
            failures.append(f"T={T} {what}")
    if at != got.size:
        failures.append(f"T={T}: the tool wrote {got.size} floats, expected {at}")


print("reference: " + ("scaled_dot_product_attention" if SDPA else f"masked softmax (torch {torch.__version__})"))
compare(2, 5, 8, 2, 1)
compare(2, 130, 32, 4, 2)
if failures:
    print("failed: " + ", ".join(failures))
    sys.exit(1)
