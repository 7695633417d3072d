"""The one place models are loaded: local files only, never remote code, CUDA when present."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from modelhost.generation import chat_templates

# Every from_pretrained call goes through these: nothing is fetched, no repository code runs.
SAFE_LOAD: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}


def pick_device(setting: str) -> str:
    """`auto` → CUDA when a GPU is visible, else CPU; anything else is used as given."""
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return setting


def load_sentence_transformer(model_dir: Path, device: str) -> Any:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device=device, **SAFE_LOAD)
    model.eval()
    return model


def load_auto(model_dir: Path, device: str, auto_class: str = "AutoModel") -> Any:
    """A transformers model through one of its Auto classes, in eval mode on `device`."""
    import transformers

    cls = getattr(transformers, auto_class)
    model = cls.from_pretrained(str(model_dir), **SAFE_LOAD)
    return model.to(device).eval()


def load_tokenizer(model_dir: Path, gguf_file: str | None = None) -> Any:
    """The artifact's tokenizer and chat template; from a GGUF file's own metadata when `gguf_file`
    names one in `model_dir` (transformers reads the embedded vocabulary, merges and template: the
    IDs round-trip exactly with llama.cpp's for the families we serve, docs/engines-llamacpp.md). Its
    template, the tenant's code, renders in the budgeted sandbox (`generation.chat_templates`)."""
    from transformers import AutoTokenizer

    chat_templates.install()

    if gguf_file is not None:
        return AutoTokenizer.from_pretrained(str(model_dir), gguf_file=gguf_file, **SAFE_LOAD)
    return AutoTokenizer.from_pretrained(str(model_dir), **SAFE_LOAD)


def is_sentence_transformer(model_dir: Path) -> bool:
    return (model_dir / "modules.json").is_file()


def load_pipeline(task: str, model_dir: Path, device: str) -> Any:
    """A transformers pipeline over local files (its own pre- and post-processing, our loading rules).

    A local folder never reaches the hub, and workers run with `HF_HUB_OFFLINE=1` besides (the
    pipeline passes its own `local_files_only`, so we cannot)."""
    import transformers

    build: Any = transformers.pipeline  # typed per task literal; ours is a runtime string
    return build(task, model=str(model_dir), device=device, trust_remote_code=False)


def load_architecture(model_dir: Path, device: str) -> Any:
    """The class named by `config.json`'s `architectures` (inspection checked it serves the pipeline)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(model_dir), **SAFE_LOAD)
    name = (config.architectures or [""])[0]
    cls = getattr(transformers, name, None)
    if cls is None:
        raise ValueError(f"transformers has no class {name!r}")
    return cls.from_pretrained(str(model_dir), **SAFE_LOAD).to(device).eval()


def load_image_processor(model_dir: Path) -> Any:
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(str(model_dir), **SAFE_LOAD)


def load_processor(model_dir: Path) -> Any:
    from transformers import AutoProcessor

    chat_templates.install()  # its chat template, as a tokenizer's (`load_tokenizer`)
    return AutoProcessor.from_pretrained(str(model_dir), **SAFE_LOAD)


def load_diffusers(model_dir: Path, device: str, auto_class: str) -> Any:
    """A diffusers pipeline through one of its AutoPipeline classes (`AutoPipelineForText2Image`, ...):
    local safetensors only (no pickles, no remote code), on `device`, without progress bars."""
    import diffusers

    diffusers.utils.logging.disable_progress_bar()
    cls = getattr(diffusers, auto_class)
    pipeline = cls.from_pretrained(str(model_dir), local_files_only=True, use_safetensors=True)
    pipeline = pipeline.to(device)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def derive_diffusers(pipeline: Any, auto_class: str) -> Any:
    """Another task's pipeline over the components of a loaded one (an image-to-image deployment
    inpainting when a mask comes): `from_pipe` shares the weights, so no memory or disk is used.
    Raises ValueError when the family has no pipeline for that task."""
    import diffusers

    derived = getattr(diffusers, auto_class).from_pipe(pipeline)
    derived.set_progress_bar_config(disable=True)
    return derived
