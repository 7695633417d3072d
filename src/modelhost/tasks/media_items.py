"""Decoding an item's media inside the worker, with the limits the gateway put in the item.

The gateway fetches bytes (URLs, base64, local paths) and attaches `limits`; decoding is CPU work,
so it happens here, off the gateway's event loop. A bad file becomes that item's 400.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from modelhost.errors import ModelhostError, error_of, param_name
from modelhost.media.decode import audio_from_samples, decode_audio, decode_video
from modelhost.media.image import decode_image


class ItemError(Exception):
    """One item's inputs cannot be used; `output` is its error output (`errors.item_error`)."""

    def __init__(self, output: dict[str, Any]) -> None:
        super().__init__(output["error"]["message"])
        self.output = output


def images(item: dict[str, Any], name: str = "inputs") -> list[Any]:
    """The item's images as RGB PIL images; errors name the request field `name`."""
    data: list[bytes] = item["images"]
    limits = item["limits"]
    try:
        return [
            decode_image(d, max_pixels=limits["max_pixels"], param=param_name(name, i, len(data)))
            for i, d in enumerate(data)
        ]
    except ModelhostError as exc:
        raise ItemError(error_of(exc)) from exc


def audios(item: dict[str, Any], target_rate: int) -> list[np.ndarray]:
    """Each audio input as float32 mono samples at the model's sampling rate."""
    limits = item["limits"]
    result = []
    try:
        for i, audio in enumerate(item["audios"]):
            param = param_name("inputs", i, len(item["audios"]))
            if "bytes" in audio:
                samples = decode_audio(
                    audio["bytes"], target_rate=target_rate, max_seconds=limits["max_seconds"], param=param
                )
            else:
                samples = audio_from_samples(
                    np.frombuffer(audio["samples"], dtype="<f4"),
                    audio["sampling_rate"] or target_rate,  # bare arrays are at the model's rate
                    target_rate=target_rate,
                    max_seconds=limits["max_seconds"],
                    param=param,
                )
            result.append(samples)
    except ModelhostError as exc:
        raise ItemError(error_of(exc)) from exc
    return result


def videos(item: dict[str, Any], num_frames: int, frame_sampling_rate: int) -> list[list[np.ndarray]]:
    limits = item["limits"]
    data: list[bytes] = item["videos"]
    try:
        return [
            decode_video(
                d,
                num_frames=num_frames,
                frame_sampling_rate=frame_sampling_rate,
                max_pixels=limits["max_pixels"],
                max_seconds=limits["max_seconds"],
                param=param_name("inputs", i, len(data)),
            )
            for i, d in enumerate(data)
        ]
    except ModelhostError as exc:
        raise ItemError(error_of(exc)) from exc


def warmup_png() -> bytes:
    """A small grey PNG for warm-up inferences of image models."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (128, 128, 128)).save(buffer, format="PNG")
    return buffer.getvalue()


WARMUP_LIMITS = {"max_pixels": 1_000_000, "max_seconds": 10.0}
