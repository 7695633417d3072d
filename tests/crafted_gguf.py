"""GGUF files written byte by byte, for the parser's tests: valid small ones, split sets, and hostile ones
(a 2^60-item array, a string longer than the file, a tensor past the end) that a trusting reader hangs on.
The `gguf` package writes the real fixtures (tests/tiny_models/gguf.py); it cannot write broken files."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

U32, STRING, ARRAY, U64 = 4, 8, 9, 10
F32, Q8_0 = 0, 8


def string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, kind: int, value: Any) -> bytes:
    """One metadata pair; `value` is an int (u32 / u64), a str, or already-encoded array bytes."""
    body = {U32: lambda v: struct.pack("<I", v), U64: lambda v: struct.pack("<Q", v), STRING: string}
    encoded = value if kind == ARRAY else body[kind](value)
    return string(key) + struct.pack("<I", kind) + encoded


def string_array(items: list[str], count: int | None = None) -> bytes:
    """An array of strings; `count` overrides the item count written (a lie, for hostile files)."""
    head = struct.pack("<IQ", STRING, len(items) if count is None else count)
    return head + b"".join(string(item) for item in items)


def tensor(name: str, dims: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    head = string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
    return head + struct.pack("<IQ", ggml_type, offset)


def gguf(
    metadata: list[bytes], tensors: list[bytes], data: int, version: int = 3, magic: bytes = b"GGUF"
) -> bytes:
    """A whole file: header, metadata, tensor infos, padding to 32 bytes and `data` zero bytes of tensors."""
    header = magic + struct.pack("<IQQ", version, len(tensors), len(metadata))
    body = header + b"".join(metadata) + b"".join(tensors)
    return body + b"\0" * (-len(body) % 32) + b"\0" * data


def model_metadata(architecture: str = "llama", **extra: int) -> list[bytes]:
    """What a small llama-style model carries: architecture, file type (Q8_0 = 7), sizes, tokens."""
    pairs = [
        kv("general.architecture", STRING, architecture),
        kv("general.file_type", U32, 7),
        kv(f"{architecture}.context_length", U32, 2048),
        kv(f"{architecture}.block_count", U32, 1),
        kv(f"{architecture}.embedding_length", U32, 32),
        kv(f"{architecture}.attention.head_count", U32, 2),
        kv(f"{architecture}.attention.head_count_kv", U32, 1),
        kv("tokenizer.ggml.model", STRING, "gpt2"),
        kv("tokenizer.ggml.tokens", ARRAY, string_array(["a", "b", "c"])),
        kv("tokenizer.chat_template", STRING, "{{ messages }}"),
    ]
    return pairs + [kv(f"{architecture}.{key}", U32, value) for key, value in extra.items()]


# A Q8_0 matrix of 32×32 (32 blocks of 34 bytes) and an F32 norm of 32
MATRIX_BYTES, NORM_BYTES = 32 * 34, 32 * 4


def small_model(**extra: int) -> bytes:
    """A valid model of two tensors: a Q8_0 matrix at 0 and an F32 vector after it (aligned to 32)."""
    norm_at = -(-MATRIX_BYTES // 32) * 32
    tensors = [
        tensor("blk.0.attn_q.weight", (32, 32), Q8_0, 0),
        tensor("output_norm.weight", (32,), F32, norm_at),
    ]
    return gguf(model_metadata("llama", **extra), tensors, norm_at + NORM_BYTES)


def split_set(folder: Path, name: str = "model", parts: int = 2, skip: int | None = None) -> None:
    """`<name>-0000k-of-0000N.gguf`, one tensor per part, llama.cpp's split keys in each; `skip`: a part
    number (from 1) left out."""
    for number in range(1, parts + 1):
        if number == skip:
            continue
        split = [
            kv("split.no", U32, number - 1),
            kv("split.count", U32, parts),
            kv("split.tensors.count", U32, parts),
        ]
        metadata = (model_metadata() if number == 1 else []) + split
        body = gguf(metadata, [tensor(f"blk.{number}.ffn_up.weight", (32, 32), Q8_0, 0)], MATRIX_BYTES)
        (folder / f"{name}-{number:05d}-of-{parts:05d}.gguf").write_bytes(body)


def _tokens(count: int) -> bytes:
    """A model whose token array says `count` items and holds one."""
    tokens = kv("tokenizer.ggml.tokens", ARRAY, string_array(["a"], count=count))
    return gguf([kv("general.architecture", STRING, "llama"), tokens], [], 0)


def _one_tensor(dims: tuple[int, ...], ggml_type: int, data: int = 4096) -> bytes:
    return gguf(model_metadata(), [tensor("blk.0.attn_q.weight", dims, ggml_type, 0)], data)


# name → (the file's bytes, words the reason must contain)
HOSTILE: dict[str, tuple[bytes, str]] = {
    "huge array length": (_tokens(1 << 60), "array of 1152921504606846976 items"),
    "huge array under the cap": (_tokens(1 << 19), "runs past the end"),
    "huge string length": (
        gguf([string("general.architecture") + struct.pack("<IQ", STRING, 1 << 62) + b"llama"], [], 0),
        "bytes long",
    ),
    "tensor past the end of the file": (_one_tensor((32, 32), Q8_0, 100), "beyond the end of the file"),
    "truncated header": (small_model()[:200], "truncated"),
    "unknown ggml type": (_one_tensor((32, 32), 77), "unknown ggml type 77"),
    "wrong magic": (b"GGML" + small_model()[4:], "not a GGUF file"),
    "wrong version": (gguf(model_metadata(), [], 0, version=1), "version 1"),
    "too many dimensions": (_one_tensor((32, 1, 1, 1, 1), F32), "5 dimensions"),
    "overlapping tensors": (
        gguf(model_metadata(), [tensor("a", (32,), F32, 0), tensor("b", (32,), F32, 64)], 4096),
        "overlap",
    ),
    "nested arrays": (
        gguf(
            [kv("general.architecture", STRING, "llama"), kv("x", ARRAY, struct.pack("<IQ", ARRAY, 4))],
            [],
            0,
        ),
        "array of arrays",
    ),
    "huge tensor count": (b"GGUF" + struct.pack("<IQQ", 3, 1 << 62, 0) + b"\0" * 64, "tensors"),
}
