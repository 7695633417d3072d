"""The one place models are loaded: local files only, never remote code, CUDA when present."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

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


def load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), **SAFE_LOAD)


def is_sentence_transformer(model_dir: Path) -> bool:
    return (model_dir / "modules.json").is_file()
