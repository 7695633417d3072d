"""Read a GGUF file's header without loading it (and without trusting it).

Our own bounded parser, in the spirit of `safetensors_check`: every count and length read from the file is
checked against a cap and against the bytes left before anything is allocated or looped over, so a crafted
file (a string of 2^63 bytes, an array of 2^60 items, a tensor past the end) fails in milliseconds with a
reason instead of hanging or exhausting memory, as the `gguf` package's reader does. The file is mapped,
not read: only the header's pages are touched.

Layout (GGUF v2 / v3, little-endian): magic `GGUF`, version u32, tensor count u64, metadata count u64, the
metadata (key string, value type u32, value), the tensor infos (name string, n_dims u32, dims u64 each,
ggml type u32, offset u64), then the tensor data, aligned to `general.alignment` (32 by default).
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Header and metadata together: a 150k-token vocabulary with its merges is ~10 MB
MAX_HEADER_BYTES = 64 * 1024 * 1024
MAX_STRING_BYTES = 16 * 1024 * 1024  # a chat template is tens of KB; a token a few bytes
MAX_ARRAY_ITEMS = 1 << 20  # vocabularies and merges: up to ~300k items
MAX_ITEMS = 1 << 21  # strings stepped over in all arrays together
MAX_KV = 1 << 14  # real files carry ~50 keys
MAX_TENSORS = 1 << 16  # experts are merged into one tensor a layer: the largest models hold thousands
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32

# ggml type id → (name, elements per block, bytes per block); llama.cpp's ggml.h / gguf's GGML_QUANT_SIZES
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}  # fmt: skip
# `general.file_type` (llama.h's llama_ftype) → the name llama-quantize gives it
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
    18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
    25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
    32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0",
}  # fmt: skip
# Encoder architectures llama.cpp serves as embedding models (its `--embedding`)
ENCODER_ARCHITECTURES = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert", "neo-bert",
     "eurobert", "t5encoder"}
)  # fmt: skip
POOLING_RANK = 4  # llama_pooling_type: NONE 0, MEAN 1, CLS 2, LAST 3, RANK 4 (a reranker, not embeddings)

# value type id → (struct format, size) for the fixed-size types
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
    7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}  # fmt: skip
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_TENSOR_TAILS = {n: struct.Struct(f"<{n}QIQ") for n in range(1, MAX_DIMS + 1)}
_SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


class InvalidGguf(Exception):
    """The file is not a GGUF modelhost can serve; the message says what is wrong (the artifact's reason)."""


@dataclass(frozen=True, slots=True)
class GgufInfo:
    """What inspection, the memory prediction and the llama.cpp engine need from a GGUF's header."""

    architecture: str
    file_type: str | None  # "F16", "Q8_0", "Q4_0", "Q4_K_M", ... from general.file_type
    tensor_types: dict[str, int]  # ggml type name → number of tensors of that type
    tensor_bytes: int  # the tensors' data, all parts of a split set together
    tensor_count: int
    context_length: int | None
    block_count: int | None
    embedding_length: int | None
    head_count: int | None
    head_count_kv: int | None
    key_length: int | None
    value_length: int | None
    chat_template: str | None
    tokenizer_model: str | None  # tokenizer.ggml.model: "gpt2" (byte-level BPE), "llama" (SentencePiece)...
    pooling_type: int | None
    embedding: bool  # an embedding model: served as feature-extraction
    name: str | None = None  # general.name
    vocab_size: int | None = None  # the embedded vocabulary's token count
    type_bytes: dict[str, int] | None = None  # ggml type name → bytes of tensor data of that type
    general_type: str | None = None  # general.type: "model", or "adapter" for a GGUF LoRA adapter


@dataclass(frozen=True, slots=True)
class GgufSet:
    """The GGUF files of one artifact."""

    model: Path  # the file to load (the first part of a split set)
    parts: tuple[Path, ...]  # every part of the model, in order (the one file when not split)
    mmproj: Path | None  # a vision projector (llama.cpp's `--mmproj`)


@dataclass(frozen=True, slots=True)
class _Tensor:
    name: str
    ggml_type: str
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class _Header:
    metadata: dict[str, Any]  # scalars and strings; arrays of numbers up to 4096 items, else their length
    tensors: tuple[_Tensor, ...]


def read_gguf(path: Path) -> GgufInfo:
    """The facts of one GGUF file; `InvalidGguf` unless its header parses within the caps and every
    tensor's data lies inside the file, aligned and without overlap."""
    header = _read_header(path)
    return _info(header, [header], path.name)


def gguf_set(folder: Path) -> GgufSet | None:
    """The GGUF files under `folder` as one model (one file, or every part of a split set) and an optional
    `mmproj*.gguf` projector; None when there is no `.gguf` file. By names only: `read_gguf_set` reads
    them."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name.lower().endswith(".gguf"))
    if not files:
        return None
    if len({p.parent for p in files}) > 1:
        raise InvalidGguf("the .gguf files are in more than one folder")
    projectors = [p for p in files if "mmproj" in p.name.lower()]
    models = [p for p in files if p not in projectors]
    if len(projectors) > 1:
        raise InvalidGguf(f"more than one vision projector: {projectors[0].name}, {projectors[1].name}")
    if not models:
        raise InvalidGguf(f"{projectors[0].name} is a vision projector; the model's .gguf file is missing")
    return GgufSet(model=models[0], parts=_parts(models), mmproj=projectors[0] if projectors else None)


def read_gguf_set(folder: Path) -> tuple[GgufSet, GgufInfo]:
    """The set under `folder` and its model's facts (tensors counted over all parts); `InvalidGguf` when
    there is none, when a part is bad or missing, or when the parts disagree on the split."""
    found = gguf_set(folder)
    if found is None:
        raise InvalidGguf("no .gguf file")
    headers = []
    for number, part in enumerate(found.parts):
        header = _read_header(part)
        if len(found.parts) > 1:
            _check_split_part(header, part.name, number, len(found.parts))
        headers.append(header)
    names = [t.name for h in headers for t in h.tensors]
    if len(set(names)) != len(names):
        raise InvalidGguf("a tensor appears in more than one part of the split set")
    expected = headers[0].metadata.get("split.tensors.count")
    if len(found.parts) > 1 and expected is not None and expected != len(names):
        raise InvalidGguf(f"the split set has {len(names)} tensors; its first part says {expected}")
    info = _info(headers[0], headers, found.model.name)
    if found.mmproj is not None:
        _read_header(found.mmproj)  # a bad projector fails the artifact too
    return found, info


def _parts(models: list[Path]) -> tuple[Path, ...]:
    if len(models) == 1 and not _SPLIT_NAME.match(models[0].name):
        return (models[0],)
    matches = [_SPLIT_NAME.match(p.name) for p in models]
    if not all(matches):
        names = ", ".join(p.name for p in models[:3])
        raise InvalidGguf(f"more than one model file ({names}); upload one model per artifact")
    prefixes = {(m["prefix"], m["count"]) for m in matches if m}
    if len(prefixes) > 1:
        raise InvalidGguf("the split parts belong to more than one set (different names or part counts)")
    prefix, count = prefixes.pop()
    total = int(count)
    numbers = {int(m["no"]) for m in matches if m}
    missing = [n for n in range(1, total + 1) if n not in numbers]
    if total < 1 or missing:
        first = missing[0] if missing else 1
        raise InvalidGguf(f"split set {prefix}: part {first:05d} of {count} is missing")
    if numbers - set(range(1, total + 1)):
        raise InvalidGguf(f"split set {prefix}: a part number is beyond {count}")
    return tuple(sorted(models))


def _check_split_part(header: _Header, name: str, number: int, total: int) -> None:
    """llama.cpp's `gguf-split` writes `split.no` (from 0) and `split.count` in every part."""
    if header.metadata.get("split.count") != total or header.metadata.get("split.no") != number:
        raise InvalidGguf(f"{name}: its split.no / split.count keys do not match its name")


def _info(first: _Header, headers: list[_Header], name: str) -> GgufInfo:
    meta = first.metadata
    architecture = meta.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise InvalidGguf(f"{name}: general.architecture is missing")
    counts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for tensor in (t for h in headers for t in h.tensors):
        counts[tensor.ggml_type] = counts.get(tensor.ggml_type, 0) + 1
        sizes[tensor.ggml_type] = sizes.get(tensor.ggml_type, 0) + tensor.nbytes
    pooling = _int(meta.get(f"{architecture}.pooling_type"))
    file_type = _int(meta.get("general.file_type"))
    tokens = meta.get("tokenizer.ggml.tokens")

    def arch_int(key: str) -> int | None:
        return _int(meta.get(f"{architecture}.{key}"))

    return GgufInfo(
        architecture=architecture,
        file_type=None if file_type is None else FILE_TYPES.get(file_type),
        tensor_types=counts,
        tensor_bytes=sum(sizes.values()),
        tensor_count=sum(counts.values()),
        context_length=arch_int("context_length"),
        block_count=arch_int("block_count"),
        embedding_length=arch_int("embedding_length"),
        head_count=arch_int("attention.head_count"),
        head_count_kv=arch_int("attention.head_count_kv"),
        key_length=arch_int("attention.key_length"),
        value_length=arch_int("attention.value_length"),
        chat_template=_str(meta.get("tokenizer.chat_template")),
        tokenizer_model=_str(meta.get("tokenizer.ggml.model")),
        pooling_type=pooling,
        embedding=pooling != POOLING_RANK and (architecture in ENCODER_ARCHITECTURES or pooling in (1, 2, 3)),
        name=_str(meta.get("general.name")),
        vocab_size=tokens.length if isinstance(tokens, _Skipped) else None,
        type_bytes=sizes,
        general_type=_str(meta.get("general.type")),
    )


def _int(value: Any) -> int | None:
    """An integer key; a per-layer array (heads vary by layer in some models) gives its largest item."""
    if isinstance(value, list):
        value = max((v for v in value if isinstance(v, int) and not isinstance(v, bool)), default=None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class _Skipped:
    """An array not kept (strings, or too long to be a hyper-parameter): its item count only."""

    length: int


class _Cursor:
    """Reads little-endian values from the mapped header, never past `limit`."""

    def __init__(self, data: mmap.mmap, limit: int) -> None:
        self.data = data
        self.limit = limit
        self.pos = 0
        self.items = 0  # array items stepped over so far, against MAX_ITEMS

    def need(self, size: int, what: str) -> None:
        if size > self.limit - self.pos:
            raise InvalidGguf(f"{what} runs past the end of the file or the header limit (truncated?)")

    def scalar(self, fmt: str, size: int, what: str) -> Any:
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return int(self.scalar("<I", 4, what))

    def u64(self, what: str) -> int:
        return int(self.scalar("<Q", 8, what))

    def string(self, what: str, cap: int = MAX_STRING_BYTES) -> str:
        length = self.u64(what)
        if length > cap:
            raise InvalidGguf(f"{what} is {length} bytes long (at most {cap})")
        self.need(length, what)
        raw = self.data[self.pos : self.pos + length]
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidGguf(f"{what} is not valid UTF-8") from exc

    def skip_strings(self, count: int, what: str) -> None:
        """Step over `count` strings: one tight loop, since a vocabulary and its merges are ~500k of them."""
        self.items += count
        if self.items > MAX_ITEMS:
            raise InvalidGguf(f"the metadata holds more than {MAX_ITEMS} array items")
        data, limit, pos, unpack = self.data, self.limit, self.pos, _U64.unpack_from
        for _ in range(count):
            if pos + 8 > limit:
                raise InvalidGguf(f"{what} runs past the end of the file or the header limit (truncated?)")
            (length,) = unpack(data, pos)
            pos += 8 + length
            if length > MAX_STRING_BYTES or pos > limit:
                raise InvalidGguf(f"an item of {what} runs past the end of the file or is too long")
        self.pos = pos


def _read_header(path: Path) -> _Header:
    """Parse and check one file's header; the caller adds the meaning (`_info`)."""
    try:
        size = path.stat().st_size
        if size < 24:
            raise InvalidGguf(f"{path.name}: shorter than a GGUF header (truncated or not GGUF)")
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(_Cursor(data, min(size, MAX_HEADER_BYTES)), size, path.name)
    except OSError as exc:
        raise InvalidGguf(f"{path.name}: cannot be read ({exc.strerror})") from exc


def _parse(cursor: _Cursor, size: int, name: str) -> _Header:
    if bytes(cursor.data[:4]) != b"GGUF":
        raise InvalidGguf(f"{name}: not a GGUF file (its first bytes are not 'GGUF')")
    cursor.pos = 4
    version = cursor.u32("the version")
    if version not in (2, 3):
        raise InvalidGguf(f"{name}: GGUF version {version} is not supported (2 or 3)")
    tensor_count = cursor.u64("the tensor count")
    kv_count = cursor.u64("the metadata count")
    if tensor_count > MAX_TENSORS:
        raise InvalidGguf(f"{name}: {tensor_count} tensors (at most {MAX_TENSORS})")
    if kv_count > MAX_KV:
        raise InvalidGguf(f"{name}: {kv_count} metadata keys (at most {MAX_KV})")
    try:
        metadata = _metadata(cursor, kv_count)
        infos = [_tensor_info(cursor) for _ in range(tensor_count)]
    except InvalidGguf as exc:
        raise InvalidGguf(f"{name}: {exc}") from exc
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise InvalidGguf(f"{name}: general.alignment {alignment!r} is not a power of two")
    data_start = -(-cursor.pos // alignment) * alignment
    return _Header(metadata=metadata, tensors=_place(infos, data_start, alignment, size, name))


def _metadata(cursor: _Cursor, count: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for _ in range(count):
        key = cursor.string("a metadata key", cap=65536)
        if key in metadata:
            raise InvalidGguf(f"metadata key {key!r} appears twice")
        try:
            metadata[key] = _value(cursor, cursor.u32("its value type"))
        except InvalidGguf as exc:
            raise InvalidGguf(f"metadata {key!r}: {exc}") from exc
    return metadata


def _value(cursor: _Cursor, kind: int) -> Any:
    if kind in _SCALARS:
        fmt, size = _SCALARS[kind]
        return cursor.scalar(fmt, size, "its value")
    if kind == _STRING:
        return cursor.string("its value")
    if kind != _ARRAY:
        raise InvalidGguf(f"unknown value type {kind}")
    item = cursor.u32("its item type")
    length = cursor.u64("its length")
    if length > MAX_ARRAY_ITEMS:
        raise InvalidGguf(f"an array of {length} items (at most {MAX_ARRAY_ITEMS})")
    return _array(cursor, item, length)


def _array(cursor: _Cursor, item: int, length: int) -> Any:
    if item in _SCALARS:
        fmt, size = _SCALARS[item]
        cursor.need(length * size, "the array")
        if length > 4096:  # a vocabulary's scores or types: nothing we read
            cursor.pos += length * size
            return _Skipped(length)
        values = list(struct.unpack_from(f"<{length}{fmt[1]}", cursor.data, cursor.pos))
        cursor.pos += length * size
        return values
    if item == _STRING:
        cursor.need(length * 8, "the array")  # each item at least its 8-byte length: checked before looping
        cursor.skip_strings(length, "the array")
        return _Skipped(length)
    if item == _ARRAY:
        raise InvalidGguf("an array of arrays, which llama.cpp does not read")
    raise InvalidGguf(f"an array of unknown value type {item}")


def _tensor_info(cursor: _Cursor) -> _Tensor:
    name = cursor.string("a tensor name", cap=1024)
    try:
        n_dims = cursor.u32("its dimension count")
        if not 1 <= n_dims <= MAX_DIMS:
            raise InvalidGguf(f"{n_dims} dimensions (1 to {MAX_DIMS})")
        tail = _TENSOR_TAILS[n_dims]  # the dimensions, the ggml type and the offset in one read
        cursor.need(tail.size, "its dimensions, type and offset")
        *dims, type_id, offset = tail.unpack_from(cursor.data, cursor.pos)
        cursor.pos += tail.size
        if type_id not in GGML_TYPES:
            raise InvalidGguf(f"unknown ggml type {type_id}")
        type_name, block, block_bytes = GGML_TYPES[type_id]
        if dims[0] % block:
            raise InvalidGguf(f"its row of {dims[0]} is not a multiple of {type_name}'s block of {block}")
    except InvalidGguf as exc:
        raise InvalidGguf(f"tensor {name!r}: {exc}") from exc
    return _Tensor(name, type_name, offset, math.prod(dims) // block * block_bytes)


def _place(
    infos: list[_Tensor], data_start: int, alignment: int, size: int, name: str
) -> tuple[_Tensor, ...]:
    """Every tensor's data aligned, inside the file and apart from the others'."""
    seen: set[str] = set()
    for info in infos:
        if info.name in seen:
            raise InvalidGguf(f"{name}: tensor {info.name!r} appears twice")
        seen.add(info.name)
        if info.offset % alignment:
            raise InvalidGguf(f"{name}: tensor {info.name!r} is not aligned to {alignment} bytes")
        if data_start + info.offset + info.nbytes > size:
            raise InvalidGguf(f"{name}: tensor {info.name!r} lies beyond the end of the file (truncated)")
    previous_end, previous = 0, ""
    for info in sorted(infos, key=lambda t: t.offset):
        if info.offset < previous_end:
            raise InvalidGguf(f"{name}: tensors {previous!r} and {info.name!r} overlap")
        previous_end, previous = info.offset + info.nbytes, info.name
    return tuple(infos)
