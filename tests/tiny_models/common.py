"""What every tiny-model builder shares: the seed, label maps, and saving a folder in one call.

Weights are random, so the only way to make a test's expectation (a label order, a non-empty mask, two
captions of different lengths) hold run after run is to draw them from a fixed seed. Each output folder
(`t01_token_classification`, `t06_image_segmentation`, ...) re-seeds torch once before its first model
and builds its models in a fixed order, so its weights depend on nothing built before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

SEED = 0


class Saveable(Protocol):
    """Anything transformers or diffusers can write into a folder (models, tokenizers, processors)."""

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> Any: ...


def reseed() -> None:
    """Reset torch's global generator: the weights that follow are the same on every run."""
    torch.manual_seed(SEED)


def label_maps(labels: Sequence[str]) -> dict[str, Any]:
    """`id2label` / `label2id` keyword arguments for a classifier config, in the order given."""
    return {
        "id2label": dict(enumerate(labels)),
        "label2id": {label: index for index, label in enumerate(labels)},
    }


def save(folder: Path, *parts: Saveable) -> Path:
    """Write every part into `folder` (safetensors for weights: the libraries' default) and return it."""
    folder.mkdir(parents=True, exist_ok=True)
    for part in parts:
        part.save_pretrained(folder)
    return folder
