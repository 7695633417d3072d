"""Decide whether uploaded files make a servable artifact for its pipeline, and say why not.

Pure file inspection: nothing is loaded or executed. Custom code (`auto_map`, unknown model types,
non-library classes) fails inspection, because `trust_remote_code` is never used. GGUF files are read by
our own bounded parser (`gguf_check`), quantized safetensors checked against their `quantization_config`
(`quantization`): a hostile file fails with a reason, never a hang.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelhost.artifacts import architectures as arch
from modelhost.artifacts.adapters import AdapterInfo, AdapterRefused, inspect_adapter, is_adapter
from modelhost.artifacts.gguf_check import GgufInfo, GgufSet, InvalidGguf, gguf_set, read_gguf_set
from modelhost.artifacts.quantization import (
    InvalidQuantization,
    Quantization,
    gguf_quantization,
    read_quantization,
)
from modelhost.artifacts.safetensors_check import InvalidSafetensors, check_safetensors
from modelhost.pipelines import TASKS

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.tiktoken")  # fmt: skip
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
NEEDS_TOKENIZER = frozenset(t.name for t in TASKS if t.needs_tokenizer)
NEEDS_PROCESSOR = frozenset(t.name for t in TASKS if t.needs_processor)
# The tasks whose deployments serve adapters (on vLLM): an adapter artifact is made for one of them
ADAPTER_TASKS = ("text-generation", "image-text-to-text")
# What llama.cpp serves from a GGUF: generation, and embeddings (its `--embedding`)
GGUF_TASKS = ("text-generation", "feature-extraction")


@dataclass(frozen=True, slots=True)
class Inspection:
    ok: bool
    size_bytes: int
    code: str | None = None
    message: str | None = None
    kind: str = "model"  # `adapter`: a LoRA adapter (PEFT's format), served on a base deployment
    adapter: AdapterInfo | None = None
    quantization: Quantization | None = None  # None: full-precision safetensors
    gguf: dict[str, Any] | None = None  # a GGUF model's facts (`gguf_facts`)


class Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def inspect_artifact(
    root: Path, pipeline: str, allow_pickle: bool = False, max_lora_rank: int = 64
) -> Inspection:
    """Inspect the files under `root` for `pipeline`: a full model, or a LoRA adapter (a folder with
    `adapter_config.json`, `artifacts.adapters`)."""
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    size = sum((root / f).stat().st_size for f in files)
    try:
        if not files:
            raise Refused("missing_config", "No files were uploaded.")
        if is_adapter(root):
            return _inspect_adapter(root, pipeline, files, size, max_lora_rank)
        _refuse_pickles(files, allow_pickle)
        if _gguf_set(root) is not None:
            return _inspect_gguf(root, pipeline, files, size)
        quantization = None
        if pipeline in arch.DIFFUSERS_TASKS:
            _inspect_diffusers(root, pipeline, allow_pickle)
        else:
            quantization = _inspect_transformers(root, pipeline, allow_pickle)
        for name in files:
            if name.endswith(".safetensors"):
                try:
                    check_safetensors(root / name)
                except InvalidSafetensors as exc:
                    raise Refused("invalid_weights", f"{name} is not valid safetensors: {exc}.") from exc
    except Refused as refused:
        return Inspection(ok=False, size_bytes=size, code=refused.code, message=refused.message)
    return Inspection(ok=True, size_bytes=size, quantization=quantization)


def _gguf_set(root: Path) -> GgufSet | None:
    try:
        return gguf_set(root)
    except InvalidGguf as exc:
        raise Refused("invalid_weights", f"GGUF: {exc}.") from exc


def _inspect_gguf(root: Path, pipeline: str, files: list[str], size: int) -> Inspection:
    """One GGUF model (a file or a split set, with an optional vision projector) for llama.cpp."""
    if pipeline not in GGUF_TASKS:
        raise Refused(
            "unsupported_architecture",
            f"A GGUF model serves text-generation (or feature-extraction: embeddings), not {pipeline}.",
        )
    others = [f for f in files if f.endswith(".safetensors")]
    if others:
        raise Refused(
            "invalid_weights",
            f"Both GGUF and safetensors weights were uploaded ({others[0]}): upload one format per artifact.",
        )
    try:
        found, info = read_gguf_set(root)
    except InvalidGguf as exc:
        raise Refused("invalid_weights", f"GGUF: {exc}.") from exc
    if info.general_type == "adapter":
        raise Refused("unsupported_adapter", "GGUF LoRA adapters are not accepted; upload PEFT's files.")
    if info.tensor_count == 0:
        raise Refused("missing_weights", f"{found.model.name} holds no tensors.")
    if info.tokenizer_model is None:
        raise Refused(
            "missing_tokenizer", f"{found.model.name} has no embedded tokenizer (tokenizer.ggml.model)."
        )
    if pipeline == "text-generation" and info.embedding:
        raise Refused(
            "unsupported_architecture",
            f"{found.model.name} is an embedding model "
            f"({info.architecture}): upload it as feature-extraction.",
        )
    return Inspection(
        ok=True, size_bytes=size, quantization=gguf_quantization(info), gguf=gguf_facts(root, found, info)
    )


def gguf_facts(root: Path, found: GgufSet, info: GgufInfo) -> dict[str, Any]:
    """What the artifact records of a GGUF model: the files to load (relative to the artifact), and the
    header's facts for the memory prediction and the engine (the chat template itself stays in the file)."""
    return {
        "model_file": found.model.relative_to(root).as_posix(),
        "parts": len(found.parts),
        "mmproj_file": found.mmproj.relative_to(root).as_posix() if found.mmproj else None,
        "architecture": info.architecture,
        "file_type": info.file_type,
        "tensor_count": info.tensor_count,
        "tensor_bytes": info.tensor_bytes,
        "tensor_types": info.tensor_types,
        "context_length": info.context_length,
        "block_count": info.block_count,
        "embedding_length": info.embedding_length,
        "head_count": info.head_count,
        "head_count_kv": info.head_count_kv,
        "key_length": info.key_length,
        "value_length": info.value_length,
        "tokenizer_model": info.tokenizer_model,
        "has_chat_template": info.chat_template is not None,
        "embedding": info.embedding,
    }


def _inspect_adapter(root: Path, pipeline: str, files: list[str], size: int, max_rank: int) -> Inspection:
    # never pickles, whatever MODELHOST_ALLOW_PICKLE_WEIGHTS says: the engine would load them itself
    _refuse_pickles(files, allow_pickle=False)
    if pipeline not in ADAPTER_TASKS:
        raise Refused(
            "unsupported_adapter",
            f"A LoRA adapter is served on a {' or '.join(ADAPTER_TASKS)} base; this artifact is {pipeline}.",
        )
    try:
        info = inspect_adapter(root, max_rank)
    except AdapterRefused as refused:
        raise Refused(refused.code, refused.message) from refused
    return Inspection(ok=True, size_bytes=size, kind="adapter", adapter=info)


def _refuse_pickles(files: list[str], allow_pickle: bool) -> None:
    pickles = [f for f in files if f.lower().endswith(PICKLE_SUFFIXES)]
    if pickles and not allow_pickle:
        raise Refused(
            "pickle_weights",
            f"Pickle-based files are refused ({', '.join(pickles[:3])}): loading them can run arbitrary "
            "code. Convert the weights to safetensors (or ask the operator to set "
            "MODELHOST_ALLOW_PICKLE_WEIGHTS).",
        )


def _read_json(path: Path, missing_code: str, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise Refused(missing_code, f"{what} is missing.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Refused("invalid_config", f"{what} is not valid JSON: {exc}.") from exc
    if not isinstance(data, dict):
        raise Refused("invalid_config", f"{what} is not a JSON object.")
    return data


def _refuse_custom_code(config: dict[str, Any], where: str) -> None:
    if "auto_map" in config:
        raise Refused(
            "custom_code",
            f"{where} declares auto_map: the model needs its own Python code, and modelhost never runs "
            "remote code (trust_remote_code is off).",
        )


def _inspect_transformers(root: Path, pipeline: str, allow_pickle: bool) -> Quantization | None:
    """Checks a transformers model; returns its quantization (None: full precision)."""
    model_dir = root
    if pipeline == "feature-extraction" and (root / "modules.json").is_file():
        model_dir = root / _sentence_transformer_model_path(root)
    config = _read_json(model_dir / "config.json", "missing_config", "config.json")
    _refuse_custom_code(config, "config.json")
    for extra in ("tokenizer_config.json", *PROCESSOR_FILES):
        if (model_dir / extra).is_file():
            _refuse_custom_code(_read_json(model_dir / extra, "invalid_config", extra), extra)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in arch.known_model_types():
        raise Refused(
            "unsupported_architecture",
            f"config.json model_type {model_type!r} is unknown to transformers; custom code is never run.",
        )
    _check_architectures(config, pipeline)
    _require_weights(model_dir, allow_pickle, ("model.safetensors",))
    if pipeline in NEEDS_TOKENIZER and not any((model_dir / f).is_file() for f in TOKENIZER_FILES):
        raise Refused(
            "missing_tokenizer", f"{pipeline} needs tokenizer files (one of {', '.join(TOKENIZER_FILES)})."
        )
    if pipeline in NEEDS_PROCESSOR and not any((model_dir / f).is_file() for f in PROCESSOR_FILES):
        raise Refused("missing_processor", f"{pipeline} needs a processor ({' or '.join(PROCESSOR_FILES)}).")
    try:
        return read_quantization(model_dir)
    except InvalidQuantization as exc:
        raise Refused("invalid_quantization", f"{exc}.") from exc


def _check_architectures(config: dict[str, Any], pipeline: str) -> None:
    names = config.get("architectures")
    if pipeline == "feature-extraction":
        return  # any known model type yields features (AutoModel / sentence-transformers)
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise Refused("unsupported_architecture", "config.json names no architectures.")
    allowed = arch.transformers_architectures(pipeline)
    wrong = [n for n in names if n not in allowed]
    if wrong:
        raise Refused(
            "unsupported_architecture", f"Architecture {wrong[0]} cannot serve the {pipeline} pipeline."
        )


def _sentence_transformer_model_path(root: Path) -> str:
    modules = json.loads((root / "modules.json").read_text(encoding="utf-8") or "null")
    if not isinstance(modules, list):
        raise Refused("invalid_config", "modules.json is not a list of modules.")
    path = ""
    for module in modules:
        kind = module.get("type", "") if isinstance(module, dict) else ""
        if not isinstance(kind, str) or not kind.startswith("sentence_transformers."):
            raise Refused(
                "custom_code", f"modules.json names a module outside sentence-transformers: {kind!r}."
            )
        if kind.rsplit(".", 1)[-1] == "Transformer":
            path = str(module.get("path", ""))
    if ".." in path.split("/") or path.startswith("/"):
        raise Refused("invalid_config", "modules.json points outside the artifact.")
    return path


def _require_weights(folder: Path, allow_pickle: bool, names: tuple[str, ...]) -> None:
    if any((folder / n).is_file() for n in names) or any(folder.glob("*.safetensors")):
        return
    for index in folder.glob("*.safetensors.index.json"):
        data = _read_json(index, "invalid_config", index.name)
        shards = set((data.get("weight_map") or {}).values())
        missing = [s for s in shards if not (folder / str(s)).is_file()]
        if missing:
            raise Refused(
                "missing_weights", f"{index.name} lists shards that were not uploaded: {missing[0]}."
            )
        if shards:
            return
    if allow_pickle and any(f.suffix in PICKLE_SUFFIXES for f in folder.iterdir() if f.is_file()):
        return
    where = folder.name or "the artifact root"
    raise Refused("missing_weights", f"No safetensors weights found in {where}.")


def _inspect_diffusers(root: Path, pipeline: str, allow_pickle: bool) -> None:
    index = _read_json(
        root / "model_index.json",
        "missing_model_index",
        f"model_index.json (a diffusers pipeline for {pipeline})",
    )
    class_name = index.get("_class_name")
    if not isinstance(class_name, str) or not arch.library_has("diffusers", class_name):
        raise Refused(
            "custom_code", f"model_index.json names a pipeline diffusers does not define: {class_name!r}."
        )
    if class_name not in arch.diffusers_pipelines(pipeline):
        raise Refused("unsupported_architecture", f"{class_name} cannot serve the {pipeline} pipeline.")
    for component, spec in index.items():
        if component.startswith("_") or not isinstance(spec, list):
            continue
        if len(spec) != 2:
            raise Refused("invalid_config", f"model_index.json component {component!r} is malformed.")
        library, cls = spec
        if library is None and cls is None:
            continue
        if (
            library not in ("diffusers", "transformers")
            or not isinstance(cls, str)
            or not arch.library_has(library, cls)
        ):
            raise Refused(
                "custom_code", f"Component {component!r} needs code outside diffusers/transformers: {spec}."
            )
        _inspect_component(root / component, component, cls, allow_pickle)


def _inspect_component(folder: Path, component: str, cls: str, allow_pickle: bool) -> None:
    if not folder.is_dir():
        raise Refused("missing_component", f"Component folder {component}/ is missing.")
    if "Scheduler" in cls:
        _read_json(
            folder / "scheduler_config.json", "missing_component", f"{component}/scheduler_config.json"
        )
    elif "Tokenizer" in cls:
        if not any((folder / f).is_file() for f in TOKENIZER_FILES):
            raise Refused("missing_tokenizer", f"{component}/ has no tokenizer files.")
    elif "Processor" in cls or "FeatureExtractor" in cls:
        if not any((folder / f).is_file() for f in PROCESSOR_FILES):
            raise Refused("missing_processor", f"{component}/ has no processor config.")
    else:
        config = _read_json(folder / "config.json", "missing_config", f"{component}/config.json")
        _refuse_custom_code(config, f"{component}/config.json")
        _require_weights(folder, allow_pickle, ("diffusion_pytorch_model.safetensors", "model.safetensors"))
