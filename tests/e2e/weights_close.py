"""Two safetensors files of F32 tensors hold the same names and shapes, and every tensor agrees:
max|a - b| / max|a| <= BOUND (per tensor); I64 tensors (BatchNorm's num_batches_tracked) must be
equal. numpy only (no torch), for the e2e tests.

    python3 weights_close.py A.safetensors B.safetensors BOUND
Prints one line per tensor; exit 0 when all agree, 1 otherwise.
"""
import json
import struct
import sys

import numpy as np


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if e["dtype"] not in ("F32", "I64"):
            raise SystemExit(f"{path}: tensor '{name}' is {e['dtype']}, expected F32 or I64")
        begin, end = e["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype="<f4" if e["dtype"] == "F32" else "<i8").reshape(e["shape"])
    return out


def main():
    a, b, bound = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
    if set(a) != set(b):
        print(f"different tensors: only in A {sorted(set(a) - set(b))}, only in B {sorted(set(b) - set(a))}")
        return 1
    worst = 0.0
    for name in sorted(a):
        if a[name].shape != b[name].shape:
            print(f"{name}: shapes {a[name].shape} and {b[name].shape}")
            return 1
        if a[name].dtype != b[name].dtype or a[name].dtype.kind == "i":
            same = a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name])
            worst = worst if same else float("inf")
            print(f"{name:40s} {'equal' if same else 'differ'}: {a[name].ravel()[:4]} and {b[name].ravel()[:4]}")
            continue
        scale = float(np.abs(a[name]).max()) or 1.0
        rel = float(np.abs(a[name].astype(np.float64) - b[name]).max()) / scale
        worst = max(worst, rel)
        print(f"{name:40s} max|d|/max|w| = {rel:.2e}")
    print(f"worst {worst:.2e} (bound {bound:g})")
    return 0 if worst <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
