#!/usr/bin/env python3
"""Writes tests/fixtures/quant/*.bin: random GGUF weight blocks and their values as the
`gguf` Python package (gguf-py, the GGUF reference implementation) decodes them.

gguf-py is an independent decoder of the published block layouts, so these fixtures pin
Strata's DequantizeRow to the format itself rather than to our own reading of it;
tests/kernels/quant_golden_test.cc requires every decoded float to be identical, bit for bit.
The tests read only the fixture files: CI does not need gguf-py.

Regenerate (deterministic; the fixtures record the gguf version in the commit that adds them):
    pip install gguf==0.19.0 numpy
    python3 tests/golden/make_quant_golden.py

Blocks are random bytes, so every code, scale and bit pattern is exercised, except the F16
fields (scales and mins), which are set to finite values of both signs over several orders
of magnitude; the first block of each file gets a subnormal half as its first F16 field.

File format (little-endian), one file per type, named for the type:
    char[4]  magic "SQB1"
    uint32   GGML type id
    uint32   n: number of values
    uint32   m: number of block bytes
    uint8[m] the blocks
    float32[n] gguf-py's decoded values
"""
import pathlib
import struct
from importlib.metadata import version

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

# Byte offsets of the F16 fields of each block (the GGUF block layouts).
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.IQ4_NL: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_XS: [0],
}

VALUES_PER_FILE = 512  # 16 blocks of 32 values or 2 super-blocks of 256


def random_half(rng):
    sign = -1.0 if rng.random() < 0.5 else 1.0
    return np.float16(sign * 10.0 ** rng.uniform(-4, 0.5))


def random_blocks(rng, qtype):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = VALUES_PER_FILE // block_elems
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for b in range(n_blocks):
        for i, at in enumerate(F16_FIELDS[qtype]):
            h = np.float16(6.0e-6) if b == 0 and i == 0 else random_half(rng)
            raw[b, at:at + 2] = np.array([h], dtype=np.float16).view(np.uint8)
    return raw


def main():
    out_dir = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "quant"
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20250310)
    for qtype in F16_FIELDS:
        raw = random_blocks(rng, qtype)
        values = quants.dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
        assert values.size == VALUES_PER_FILE and np.all(np.isfinite(values)), qtype.name
        data = b"SQB1" + struct.pack("<III", int(qtype), values.size, raw.size)
        data += raw.tobytes() + values.astype("<f4").tobytes()
        (out_dir / f"{qtype.name}.bin").write_bytes(data)
    print(f"wrote {len(F16_FIELDS)} fixtures to {out_dir} (gguf {version('gguf')})")


main()
