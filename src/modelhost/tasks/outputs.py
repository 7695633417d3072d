"""Turning model outputs into msgpack-able plain data (and PNG masks into base64)."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np


def plain(value: Any) -> Any:
    """numpy / torch scalars and arrays → Python numbers and lists, recursively."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if hasattr(value, "tolist"):  # torch tensors
        return value.tolist()
    return value


def png_base64(image: Any) -> str:
    """A PIL image as a base64 PNG string (segmentation masks)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")
