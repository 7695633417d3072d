"""Decoding image bytes into an RGB PIL image, under the operator's pixel limit.

Apart from `media.decode` (audio and video: PyAV, soundfile, SciPy) because PIL is all it needs: the
vLLM replica worker, which runs in vLLM's own environment without those libraries, decodes a chat's
images with this same function. Plain functions, no asyncio, no gateway imports.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from typing import TypeVar

from PIL import Image, ImageOps

from modelhost.errors import InvalidMedia

T = TypeVar("T")


def decode_image(data: bytes, *, max_pixels: int, param: str) -> Image.Image:
    """An RGB image, fully loaded, upright per its EXIF orientation (as transformers' `load_image`)."""
    image = _pil(lambda: Image.open(io.BytesIO(data)), param)
    width, height = image.size
    if width * height > max_pixels:
        raise InvalidMedia(
            f"Image in `{param}` is too large: {width}×{height} pixels (limit {max_pixels} pixels)",
            param=param,
        )
    return _pil(lambda: _upright_rgb(image), param)


def _upright_rgb(image: Image.Image) -> Image.Image:
    image.load()
    ImageOps.exif_transpose(image, in_place=True)
    return image.convert("RGB")


def _pil(step: Callable[[], T], param: str) -> T:
    """Runs a PIL step, turning its failures into InvalidMedia.

    PIL's own bomb warning is silenced because `max_pixels` is the operator's limit; its hard error
    (twice PIL's limit) still refuses. Plugins raise many unrelated types for malformed input
    (SyntaxError, struct.error, IndexError...), so any exception here means an unreadable image.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return step()
    except Image.DecompressionBombError:
        raise InvalidMedia(f"Image in `{param}` is too large to decode", param=param) from None
    except Exception:
        raise InvalidMedia(
            f"`{param}` is not a readable image (or the file is truncated)", param=param
        ) from None
