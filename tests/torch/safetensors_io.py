"""safetensors files for PyTorch with the standard library only (json, struct) plus torch.

No safetensors package exists here, so the PyTorch agreement tests read and write dtrain's files
with this module. It writes what dtrain's writer writes, byte for byte (sorted keys, compact
JSON, space padding to 8 bytes, data ordered by element size then name), and reads as strictly as
dtrain's reader: a bad length, invalid JSON, a repeated key, an unknown dtype, a size that does
not match the shape, offsets out of range, overlapping, leaving gaps or trailing bytes all raise
SafetensorsError naming the file.

    tensors, metadata = load("model.safetensors")     # dict name -> torch.Tensor (CPU), dict str -> str
    save("out.safetensors", {"1.weight": w}, {"format": "pt"})
"""
import json
import os
import struct

import torch

# In the order dtrain's writer sorts by (element size; larger first).
DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "F16": torch.float16,
    "BF16": torch.bfloat16, "I32": torch.int32, "F32": torch.float32, "I64": torch.int64, "F64": torch.float64,
}
_ORDER = list(DTYPES)
_NAMES = {v: k for k, v in DTYPES.items()}
MAX_HEADER_BYTES = 100_000_000


class SafetensorsError(ValueError):
    pass


def _element_size(dtype_name):
    return torch.empty((), dtype=DTYPES[dtype_name]).element_size()


def _no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    for k in keys:
        if keys.count(k) > 1:
            raise SafetensorsError(f"header has the key '{k}' twice")
    return dict(pairs)


def parse_header(raw, source="<bytes>"):
    """Validates a whole file's bytes; returns (entries {name: (dtype, shape, begin, end)}, metadata, data start)."""
    def fail(problem):
        raise SafetensorsError(f"{source}: {problem}")
    if len(raw) < 8:
        fail(f"{len(raw)} bytes, too short for the 8-byte header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > MAX_HEADER_BYTES:
        fail(f"header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes")
    if n > len(raw) - 8:
        fail(f"header length {n} exceeds the {len(raw) - 8} bytes after it")
    text = raw[8:8 + n]
    if not text.startswith(b"{"):
        fail("header does not start with '{'")
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except SafetensorsError as e:
        fail(str(e))
    except ValueError as e:
        fail(f"header is not valid JSON: {e}")
    if not isinstance(header, dict):
        fail("header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        fail("__metadata__ is not a map of strings")
    data_bytes = len(raw) - 8 - n
    entries = {}
    for name, e in header.items():
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            fail(f"tensor '{name}' needs exactly dtype, shape and data_offsets")
        if e["dtype"] not in DTYPES:
            fail(f"tensor '{name}' has unknown dtype '{e['dtype']}'")
        shape, offsets = e["shape"], e["data_offsets"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            fail(f"tensor '{name}' has shape {shape}, not a list of sizes")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and o >= 0 for o in offsets)):
            fail(f"tensor '{name}' has no data_offsets [begin, end]")
        begin, end = offsets
        if begin > end or end > data_bytes:
            fail(f"tensor '{name}' has data_offsets [{begin}, {end}] outside the {data_bytes}-byte data buffer")
        numel = 1
        for d in shape:
            numel *= d
        if numel * _element_size(e["dtype"]) != end - begin:
            fail(f"tensor '{name}' of dtype {e['dtype']} and shape {shape} does not fill [{begin}, {end})")
        entries[name] = (e["dtype"], shape, begin, end)
    covered = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if begin != covered:
            fail(f"tensor '{name}' starts at {begin}, expected {covered} (overlap or gap)")
        covered = end
    if covered != data_bytes:
        fail(f"{data_bytes - covered} trailing bytes after the last tensor")
    return entries, metadata, 8 + n


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    entries, metadata, start = parse_header(raw, str(path))
    tensors = {}
    for name in sorted(entries):
        dtype, shape, begin, end = entries[name]
        if begin == end:
            tensors[name] = torch.empty(shape, dtype=DTYPES[dtype])
            continue
        flat = torch.frombuffer(bytearray(raw[start + begin:start + end]), dtype=torch.uint8)
        tensors[name] = flat.view(DTYPES[dtype]).reshape(shape).clone()
    return tensors, metadata


def encode(tensors, metadata=None):
    """The file's bytes, laid out as dtrain's writer lays them out."""
    order = sorted(tensors, key=lambda k: (-_ORDER.index(_NAMES[tensors[k].dtype]), k))
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in order:
        t = tensors[name].detach().cpu().contiguous()
        data = bytearray(t.numel() * t.element_size())
        if data:  # torch only, no numpy: copy the tensor's bytes into a buffer torch writes through
            torch.frombuffer(data, dtype=torch.uint8).copy_(t.reshape(-1).view(torch.uint8))
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(bytes(c) for c in chunks)


def save(path, tensors, metadata=None):
    """Writes to a temporary name and renames, so no reader sees a half-written file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(encode(tensors, metadata))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
