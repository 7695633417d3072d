"""LoRA adapters made the way customers make them (PEFT on a base's folder, `save_pretrained`) and the same
adapter merged into the base's weights and saved as a full model: `bench.models` builds both, for the
benchmarks and the tests alike. What this module adds are the edits the tests refuse: a config that says
otherwise, tensors renamed or of another shape.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from bench.models import TARGETS, build_adapter, build_merged
from safetensors.torch import load_file, save_file

__all__ = ["TARGETS", "build_adapter", "build_merged", "edit_config", "edit_tensors"]


def edit_config(adapter: Path, out: Path, **changes: Any) -> Path:
    """A copy of `adapter` (or itself, where `out` is it) whose adapter_config.json says otherwise (DoRA,
    a bias, another rank...)."""
    if out != adapter:
        shutil.copytree(adapter, out)
    path = out / "adapter_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, **changes}))
    return out


def edit_tensors(
    adapter: Path,
    out: Path,
    rename: dict[str, str] | None = None,
    reshape: dict[str, tuple[int, ...]] | None = None,
) -> Path:
    """A copy of `adapter` with tensors renamed, or replaced by zeros of another shape."""
    shutil.copytree(adapter, out)
    path = out / "adapter_model.safetensors"
    tensors = load_file(path)
    for old, new in (rename or {}).items():
        tensors[new] = tensors.pop(old)
    for name, shape in (reshape or {}).items():
        tensors[name] = torch.zeros(shape)
    save_file(tensors, path)
    return out
