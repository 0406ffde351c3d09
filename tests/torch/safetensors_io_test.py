"""PyTorch side of dtrain's safetensors files (CTest label torch).

    /usr/bin/python3 safetensors_io_test.py PATH/TO/dtrain_checkpoint_tool

dtrain's file of every dtype loads here with the right values and a PyTorch-compatible header;
this module writes the same bytes for the same tensors and dtrain reads them back; dtrain's
MLP parameters load into torch.nn.Sequential with strict=True; a malformed file is rejected on
both sides. Exit 77 (CTest: skipped) with the reason when torch cannot be imported.
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from torch import nn
except Exception as e:  # noqa: BLE001 - any import failure means: skip, saying why
    print(f"skipped: /usr/bin/python3 cannot import torch: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

TOOL = sys.argv[1]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def tool(*args):
    return subprocess.run([TOOL, *args], capture_output=True, text=True)


def expected_sample():
    """What `dtrain_checkpoint_tool write-sample` writes (same formulas as checkpoint_tool.cpp)."""
    def f(n, dtype):
        return torch.tensor([(i - 3.5) / 8 for i in range(n)], dtype=dtype)
    return {
        "bf16": torch.tensor([0x3F80 + i for i in range(6)], dtype=torch.int16).view(torch.bfloat16).reshape(2, 3),
        "f16": torch.tensor([0x3C00 + i for i in range(5)], dtype=torch.int16).view(torch.float16),
        "f32": f(12, torch.float32).reshape(3, 4),
        "f64": f(2, torch.float64),
        "i32": torch.tensor([i * 1000 - 7 for i in range(4)], dtype=torch.int32),
        "i64": torch.tensor([(1 << 40) + i for i in range(3)], dtype=torch.int64),
        "scalar": f(1, torch.float32).reshape(()),
        "u8": torch.tensor([(i * 37) % 256 for i in range(7)], dtype=torch.uint8),
        "z.empty": torch.empty((0, 3), dtype=torch.float32),
    }


def same(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype in (torch.float16, torch.bfloat16):
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    return torch.equal(a, b)


with tempfile.TemporaryDirectory() as d:
    cpp = os.path.join(d, "cpp.safetensors")
    r = tool("write-sample", cpp)
    check(r.returncode == 0, f"dtrain writes the sample ({r.stderr.strip()})")
    tensors, metadata = safetensors_io.load(cpp)
    want = expected_sample()
    check(sorted(tensors) == sorted(want), "every tensor name comes back")
    for name, t in want.items():
        check(name in tensors and same(tensors[name], t), f"tensor {name} ({t.dtype}, {tuple(t.shape)}) equal")
    check(metadata == {"format": "pt", "written_by": "dtrain"}, "__metadata__ comes back")

    raw = open(cpp, "rb").read()
    entries, _, start = safetensors_io.parse_header(raw, cpp)
    check(start % 8 == 0, "data starts 8-aligned")
    keys = list(__import__("json").loads(raw[8:start]).keys())
    check(keys == sorted(keys), "header keys sorted")
    check(all(b % torch.empty((), dtype=safetensors_io.DTYPES[dt]).element_size() == 0
              for dt, _, b, _ in entries.values()), "every tensor aligned to its element size")

    py = os.path.join(d, "py.safetensors")
    safetensors_io.save(py, want, {"format": "pt", "written_by": "dtrain"})
    check(open(py, "rb").read() == raw, "this module writes dtrain's bytes exactly")
    r = tool("check-sample", py)
    check(r.returncode == 0, f"dtrain reads the file written here ({r.stderr.strip()})")

    mlp = os.path.join(d, "mlp.safetensors")
    r = tool("write-mlp", mlp)
    check(r.returncode == 0, f"dtrain writes its MLP's parameters ({r.stderr.strip()})")
    state, _ = safetensors_io.load(mlp)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    result = model.load_state_dict(state, strict=True)
    check(not result.missing_keys and not result.unexpected_keys,
          "nn.Sequential(Flatten, Linear, ReLU, Linear).load_state_dict(strict=True) takes dtrain's weights")
    check(torch.equal(model[1].weight, state["1.weight"]) and model(torch.zeros(2, 1, 28, 28)).shape == (2, 10),
          "the loaded model computes")

    bad = os.path.join(d, "bad.safetensors")
    with open(bad, "wb") as f:
        f.write(raw + b"\0" * 8)
    r = tool("check-sample", bad)
    check(r.returncode == 1 and r.stderr.count("\n") == 1 and "8 trailing bytes" in r.stderr,
          f"dtrain rejects trailing bytes in one line ({r.stderr.strip()})")
    try:
        safetensors_io.load(bad)
        check(False, "this module rejects trailing bytes")
    except safetensors_io.SafetensorsError as e:
        check("trailing bytes" in str(e), f"this module rejects trailing bytes ({e})")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
