"""Validate a `.safetensors` file's header without loading it (and without trusting it)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

MAX_HEADER_BYTES = 100 * 1024 * 1024
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
    "C64": 8, "F4": 1, "F6_E2M3": 1, "F6_E3M2": 1,
}  # fmt: skip


class InvalidSafetensors(ValueError):
    pass


def check_safetensors(path: Path) -> int:
    """Raise `InvalidSafetensors` unless the header parses and every tensor lies inside the file.

    Returns the number of tensors. Catches truncation, garbage and pickles renamed to .safetensors.
    """
    return len(tensor_shapes(path))


def tensor_shapes(path: Path) -> dict[str, list[int]]:
    """Every tensor's shape by name, from a header checked as `check_safetensors` says (adapters are
    checked against their config and their base by these, without loading a weight)."""
    return {name: shape for name, (_, shape) in tensor_table(path).items()}


def tensor_table(path: Path) -> dict[str, tuple[str, list[int]]]:
    """Every tensor's dtype and shape by name, checked as `check_safetensors` says (quantized weights are
    checked against their `quantization_config` by these: packed int32 words, FP8 bytes)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise InvalidSafetensors("file shorter than the 8-byte header length")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len == 0 or header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise InvalidSafetensors("header length is out of range (truncated or not safetensors)")
        raw = handle.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidSafetensors("header is not valid JSON") from exc
    if not isinstance(header, dict):
        raise InvalidSafetensors("header is not a JSON object")
    data_size = size - 8 - header_len
    table: dict[str, tuple[str, list[int]]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        _check_tensor(name, info, data_size)
        table[name] = (info["dtype"], info["shape"])
    return table


def _check_tensor(name: str, info: object, data_size: int) -> None:
    if not isinstance(info, dict):
        raise InvalidSafetensors(f"tensor {name!r}: entry is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise InvalidSafetensors(f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InvalidSafetensors(f"tensor {name!r}: invalid shape")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise InvalidSafetensors(f"tensor {name!r}: invalid data_offsets")
    if offsets[1] > data_size:
        raise InvalidSafetensors(f"tensor {name!r} lies beyond the end of the file (truncated)")
    expected = math.prod(shape) * DTYPE_BYTES[dtype]
    if dtype in ("F4", "F6_E2M3", "F6_E3M2"):
        return  # sub-byte types pack; the bound check above is what matters
    if offsets[1] - offsets[0] != expected:
        raise InvalidSafetensors(f"tensor {name!r}: size does not match its shape and dtype")
