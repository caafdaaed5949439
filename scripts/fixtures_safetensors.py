#!/usr/bin/env python3
"""scripts/fixtures_safetensors.py — writes tests/fixtures/st_python.safetensors with the Python `safetensors`
package (the reference writer), for tests/test_safetensors.c.

Every value is a closed-form pattern that the C test recomputes; the C writer must also reproduce this file byte
for byte from the same tensors and metadata. Run: .venv/bin/python scripts/fixtures_safetensors.py
(needs numpy and safetensors; to be merged into scripts/gen_fixtures.py later).
"""
import os
import struct
import sys

import numpy as np
from safetensors import TensorSpec, serialize_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "st_python.safetensors")


def bf16_bits(values):
    """Raw bf16 bit patterns (uint16) of float32 values that are exactly representable in bf16."""
    out = []
    for v in values:
        (u,) = struct.unpack("<I", struct.pack("<f", v))
        assert u & 0xFFFF == 0, f"{v} is not exact in bf16"
        out.append(u >> 16)
    return np.array(out, dtype=np.uint16)


def tensors():
    """name -> (safetensors dtype name, numpy array with the raw little-endian elements)."""
    i = np.arange(6)
    return {
        # F32 [2,3]: 0.25*i - 0.5
        "f32": ("float32", (0.25 * i - 0.5).astype(np.float32).reshape(2, 3)),
        # F16 [6]: 0.5*i - 1 for i < 4, then the f16 max 65504 and the smallest subnormal 2^-24
        "f16": ("float16", np.array([-1.0, -0.5, 0.0, 0.5, 65504.0, 2.0**-24], dtype=np.float16)),
        # BF16 [2,2]: 1.0, -2.5, 0.15625, 2^100
        "bf16": ("bfloat16", bf16_bits([1.0, -2.5, 0.15625, 2.0**100]).reshape(2, 2)),
        # I64 [3]: -2^40, 0, 2^62 + 1
        "i64": ("int64", np.array([-(2**40), 0, 2**62 + 1], dtype=np.int64)),
        # U8 [7]: (37*i + 3) mod 256 — odd length, laid out last by the writer's dtype order
        "u8": ("uint8", ((37 * np.arange(7) + 3) % 256).astype(np.uint8)),
        # F32 scalar (shape []): 3.5
        "scalar": ("float32", np.array(3.5, dtype=np.float32)),
        # F32 [0, 4]: empty
        "empty": ("float32", np.zeros((0, 4), dtype=np.float32)),
        # a model-style dotted name, F32 [3]: 10, 20, 30
        "blocks.0.attn.to_q.weight": ("float32", np.array([10.0, 20.0, 30.0], dtype=np.float32)),
    }


def main():
    ts = tensors()
    keep = []
    specs = {}
    for name, (dt, arr) in ts.items():
        arr = np.array(arr, order="C", copy=True)  # (ascontiguousarray would turn a 0-d scalar into shape [1])
        assert sys.byteorder == "little"
        keep.append(arr)
        specs[name] = TensorSpec(dtype=dt, shape=list(arr.shape), data_ptr=arr.ctypes.data, data_len=arr.nbytes)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    serialize_file(specs, OUT, metadata={"format": "pt", "note": "vgrpo fixture"})
    size = os.path.getsize(OUT)
    assert size < 10 * 1024
    print(f"wrote {os.path.normpath(OUT)} ({size} bytes)")


if __name__ == "__main__":
    main()
