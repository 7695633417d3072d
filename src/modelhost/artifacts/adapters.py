"""LoRA adapters in PEFT's format: what inspection accepts, and whether an adapter fits a base.

An adapter artifact is a folder with `adapter_config.json` and `adapter_model.safetensors`, as PEFT's
`save_pretrained` writes them. It is served by vLLM on its base's replicas (docs/adapters.md), which
applies plain LoRA: every weight `W` of a target module becomes `W + alpha / r · B A` (`alpha / sqrt(r)`
with rsLoRA). So inspection refuses what that would serve wrongly (DoRA, trained copies of whole modules,
biases, per-module ranks) and what does not add up (tensors whose shapes disagree with their config or
each other, keys outside the target modules), reading only the config and the safetensors header.

Whether an adapter fits a base is decided when its deployment is created, from the same header and the
base's own: every target module must exist in the base and every `lora_A` / `lora_B` must match its
module's input and output sizes. Nothing is loaded.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from modelhost.artifacts.quantization import InvalidQuantization, read_quantization
from modelhost.artifacts.safetensors_check import InvalidSafetensors, tensor_shapes

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
# PEFT saves `base_model.model.<module>.lora_A.weight` (the adapter's name dropped)
_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<side>[AB])\.weight$")
# PEFT features whose weights plain LoRA would ignore or misapply: refused, each with its reason
_UNSERVED = {
    "use_dora": "DoRA adapters (use_dora) are not served: the engine applies plain LoRA",
    "modules_to_save": "adapters with trained copies of whole modules (modules_to_save) are not served",
    "rank_pattern": "per-module ranks (rank_pattern) are not served: one rank for every module",
    "alpha_pattern": "per-module alphas (alpha_pattern) are not served: one alpha for every module",
    "target_parameters": "LoRA on parameters (target_parameters) is not served, only on modules",
    "trainable_token_indices": "trained token embeddings (trainable_token_indices) are not served",
    "layer_replication": "replicated layers (layer_replication) are not served",
    "lora_bias": "LoRA biases (lora_bias) are not served",
}


class AdapterRefused(Exception):
    """Inspection's refusal of an adapter: `code` and a message that names what is wrong."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class AdapterMismatch(ValueError):
    """The adapter does not fit the base: the message names the first module or tensor that does not."""


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    """What an adapter artifact is (stored with the artifact, shown as its `adapter`)."""

    peft_type: str
    rank: int
    alpha: float
    target_modules: list[str] | str
    base_model_name_or_path: str | None
    bytes: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_adapter(root: Path) -> bool:
    """An adapter is a folder with PEFT's config at its top."""
    return (root / CONFIG).is_file()


def inspect_adapter(root: Path, max_rank: int) -> AdapterInfo:
    """The adapter under `root`, or AdapterRefused with the reason."""
    config = _config(root)
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise AdapterRefused("unsupported_adapter", f"peft_type {peft_type!r}: only LoRA is served.")
    for field, reason in _UNSERVED.items():
        if config.get(field):
            raise AdapterRefused("unsupported_adapter", f"{reason} ({field}: {config[field]!r}).")
    if config.get("bias", "none") != "none":
        raise AdapterRefused(
            "unsupported_adapter", f"bias {config['bias']!r}: only adapters with bias 'none' are served."
        )
    rank, alpha = config.get("r"), config.get("lora_alpha", 8)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterRefused("invalid_adapter", f"{CONFIG}: r must be a positive integer, not {rank!r}.")
    if rank > max_rank:
        raise AdapterRefused(
            "adapter_rank_too_high",
            f"The adapter's rank {rank} is above this server's limit of {max_rank} "
            "(MODELHOST_MAX_LORA_RANK).",
        )
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise AdapterRefused("invalid_adapter", f"{CONFIG}: lora_alpha must be a number, not {alpha!r}.")
    targets = _targets(config.get("target_modules"))
    modules = adapter_modules(root)
    for module, (a, b) in modules.items():
        if not _targeted(module, targets):
            raise AdapterRefused(
                "invalid_adapter",
                f"Tensor {_name(module, 'A')} lies outside the target modules {targets!r}.",
            )
        if len(a) != 2 or len(b) != 2:
            raise AdapterRefused("adapter_shape_mismatch", f"{_name(module, 'A')} and {_name(module, 'B')} "
                                 f"must be matrices: their shapes are {a} and {b}.")  # fmt: skip
        if a[0] != rank:
            raise AdapterRefused(
                "adapter_shape_mismatch",
                f"{_name(module, 'A')} has shape {a}: its first dimension should be the rank r = {rank} "
                f"of {CONFIG}.",
            )
        if b[1] != a[0]:
            raise AdapterRefused(
                "adapter_shape_mismatch",
                f"{_name(module, 'B')} has shape {b} and {_name(module, 'A')} has shape {a}: B's second "
                "dimension must equal A's first (the rank).",
            )
    base = config.get("base_model_name_or_path")
    return AdapterInfo(
        peft_type="LORA",
        rank=rank,
        alpha=float(alpha),
        target_modules=sorted(targets) if isinstance(targets, list) else targets,
        base_model_name_or_path=base if isinstance(base, str) else None,
        bytes=(root / WEIGHTS).stat().st_size,
    )


def adapter_modules(root: Path) -> dict[str, tuple[list[int], list[int]]]:
    """Every adapted module's `lora_A` and `lora_B` shapes, by the module's name in the base."""
    path = root / WEIGHTS
    if not path.is_file():
        raise AdapterRefused("missing_weights", f"{WEIGHTS} is missing (PEFT's safetensors weights).")
    try:
        shapes = tensor_shapes(path)
    except InvalidSafetensors as exc:
        raise AdapterRefused("invalid_weights", f"{WEIGHTS} is not valid safetensors: {exc}.") from exc
    sides: dict[str, dict[str, list[int]]] = {}
    for key, shape in shapes.items():
        match = _KEY.match(key)
        if match is None:
            raise AdapterRefused(
                "invalid_adapter",
                f"Tensor {key} is not a LoRA matrix (PEFT's base_model.model.<module>.lora_A/B.weight).",
            )
        sides.setdefault(match["module"], {})[match["side"]] = shape
    if not sides:
        raise AdapterRefused("invalid_adapter", f"{WEIGHTS} holds no LoRA matrices.")
    modules = {}
    for module, pair in sorted(sides.items()):
        missing = next((side for side in "AB" if side not in pair), None)
        if missing is not None:
            raise AdapterRefused("adapter_shape_mismatch", f"{_name(module, missing)} is missing.")
        modules[module] = (pair["A"], pair["B"])
    return modules


def check_fits_base(adapter_dir: Path, base_dir: Path, targets: list[str] | str) -> None:
    """AdapterMismatch unless every target module exists in the base and every adapted module's
    matrices match the base weight's sizes (`lora_A`: rank × inputs, `lora_B`: outputs × rank)."""
    weights: dict[str, list[int]] = {}
    for shard in sorted(base_dir.glob("*.safetensors")):
        weights.update(tensor_shapes(shard))
    weights.update(_unpacked_weights(weights, base_dir))
    base_modules = {name.removesuffix(".weight") for name in weights if name.endswith(".weight")}
    if isinstance(targets, list):
        for target in targets:
            if not any(_targeted(module, [target]) for module in base_modules):
                raise AdapterMismatch(f"The base's architecture has no module named {target!r} (a target).")
    for module, (a, b) in adapter_modules(adapter_dir).items():
        weight = weights.get(f"{module}.weight")
        if weight is None or len(weight) != 2:
            raise AdapterMismatch(f"The base has no linear module {module} for {_name(module, 'A')}.")
        outputs, inputs = weight
        if a[1] != inputs:
            raise AdapterMismatch(
                f"{_name(module, 'A')} has shape {a}: its second dimension should be the base's {inputs} "
                f"inputs of {module} (its weight is {weight})."
            )
        if b[0] != outputs:
            raise AdapterMismatch(
                f"{_name(module, 'B')} has shape {b}: its first dimension should be the base's {outputs} "
                f"outputs of {module} (its weight is {weight})."
            )


def _unpacked_weights(tensors: dict[str, list[int]], base_dir: Path) -> dict[str, list[int]]:
    """A quantized base's packed linear modules as the `[outputs, inputs]` weights they stand for (vLLM
    serves LoRA on GPTQ, AWQ and compressed-tensors bases): GPTQ's `qweight` packs the inputs (`[in ·
    bits / 32, out]`), AWQ's the outputs (`[in, out · bits / 32]`), compressed-tensors' `weight_packed`
    the inputs (`[out, in · bits / 32]`). Empty for a full-precision base (or a malformed quantization,
    which inspection refused)."""
    try:
        quantization = read_quantization(base_dir)
    except InvalidQuantization:
        return {}
    if quantization is None or not quantization.bits:
        return {}
    per_word = 32 // quantization.bits
    unpacked: dict[str, list[int]] = {}
    for name, shape in tensors.items():
        module, _, kind = name.rpartition(".")
        if len(shape) != 2:
            continue
        if kind == "qweight" and quantization.method == "gptq":
            unpacked[f"{module}.weight"] = [shape[1], shape[0] * per_word]
        elif kind == "qweight" and quantization.method == "awq":
            unpacked[f"{module}.weight"] = [shape[1] * per_word, shape[0]]
        elif kind == "weight_packed":
            unpacked[f"{module}.weight"] = [shape[0], shape[1] * per_word]
    return unpacked


def _targets(targets: object) -> list[str] | str:
    if isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets):
        return targets
    if isinstance(targets, str):
        try:
            re.compile(targets)
            return targets
        except re.error as exc:
            raise AdapterRefused(
                "invalid_adapter", f"{CONFIG}: target_modules {targets!r} is not a regular expression: {exc}."
            ) from exc
    raise AdapterRefused("invalid_adapter", f"{CONFIG}: target_modules must name modules, not {targets!r}.")


def _config(root: Path) -> dict[str, Any]:
    try:
        config = json.loads((root / CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterRefused("invalid_config", f"{CONFIG} is not valid JSON: {exc}.") from exc
    if not isinstance(config, dict):
        raise AdapterRefused("invalid_config", f"{CONFIG} is not a JSON object.")
    return config


def _targeted(module: str, targets: list[str] | str) -> bool:
    """PEFT's rule: a string is a regular expression the whole name matches; a list names modules by
    their last parts (`q_proj` targets `model.layers.0.self_attn.q_proj`); `all-linear`: every one."""
    if isinstance(targets, str):
        return targets == "all-linear" or re.fullmatch(targets, module) is not None
    return any(module == t or module.endswith(f".{t}") for t in targets)


def _name(module: str, side: str) -> str:
    return f"base_model.model.{module}.lora_{side}.weight"
