"""What the image generation and editing handlers share (api.md §4.3, OpenAI's `/v1/images/edits`).

Every output image is one "job": its prompt, its own seeded generator and, for edits, its input
image and mask. Items with equal options share pipeline calls (lists of prompts and generators), at
most MAX_IMAGES_PER_CALL images a call so that a full batch cannot exhaust the device's memory.

A seeded item always gets calls of its own: a batch's numbers depend slightly on its size and
neighbours (about 1e-5 on CPU, more with cuDNN's shape-dependent kernels), and a seed promises the
same bytes for the same request whatever else is queued with it.
"""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image

from modelhost.errors import item_error
from modelhost.media.encode import IMAGE_FORMATS, encode_image
from modelhost.protocol.images import SIDE_MAX, SIDE_MIN, SIDE_STEP
from modelhost.tasks.base import options_key

MAX_IMAGES_PER_CALL = 8

AUTO_PIPELINES = {
    "text-to-image": "AutoPipelineForText2Image",
    "image-to-image": "AutoPipelineForImage2Image",
    "inpainting": "AutoPipelineForInpainting",
}


@dataclass
class Job:
    """One image to make."""

    item: int
    prompt: str
    negative_prompt: str | None
    generator: torch.Generator
    image: Image.Image | None = None
    mask: Image.Image | None = None


def generators(seed: int | None, count: int) -> list[torch.Generator]:
    """The i-th image's noise comes from `seed + i`. Without a seed, from fresh randomness: torch's
    global generator starts from the same seed in every process, so it would repeat across restarts.
    CPU generators give the same noise whatever the device."""
    seeds = [seed + i if seed is not None else secrets.randbits(63) for i in range(count)]
    return [torch.Generator("cpu").manual_seed(s) for s in seeds]


def fitted(width: int, height: int) -> tuple[int, int]:
    """An edit's `auto` size: the image's own, scaled down to fit SIDE_MAX, on the 16-pixel grid."""
    scale = min(1.0, SIDE_MAX / max(width, height))
    return (_on_grid(width * scale), _on_grid(height * scale))


def _on_grid(side: float) -> int:
    return min(SIDE_MAX, max(SIDE_MIN, int(side) // SIDE_STEP * SIDE_STEP))


def mask_for(mask: Image.Image, size: tuple[int, int]) -> Image.Image:
    """Grey levels at the image's size: white repaints, black keeps (diffusers' convention, as is)."""
    return mask.convert("L").resize(size, Image.Resampling.BILINEAR)


def grouped_indices(indices: Iterable[int], key: Callable[[int], Hashable]) -> list[list[int]]:
    groups: dict[Hashable, list[int]] = {}
    for i in indices:
        groups.setdefault(key(i), []).append(i)
    return list(groups.values())


def sharing_key(item: dict[str, Any], index: int, fields: tuple[str, ...]) -> tuple[Any, ...]:
    """Items with this key in common can share pipeline calls (see the module docstring for seeds).

    A missing negative prompt is not the same as an empty one for every family (SDXL uses zeros)."""
    key = (*options_key(item, fields), item.get("negative_prompt") is None)
    return (*key, index) if item.get("seed") is not None else key


def call_defaults(pipeline: Any) -> dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(pipeline.__call__).parameters.items()}


def refusal(pipeline: Any, options: dict[str, Any], negative: bool) -> dict[str, Any] | None:
    """An item error when the model's pipeline does not take an option the request set."""
    accepted = call_defaults(pipeline)
    for name in [*options, *(["negative_prompt"] if negative else [])]:
        if name not in accepted:
            param = "size" if name in ("width", "height") else name
            return item_error(f"This model's pipeline does not take `{param}`.", param)
    return None


def make_images(pipeline: Any, jobs: list[Job], options: dict[str, Any]) -> list[Image.Image]:
    """The jobs' images, in order, in calls of at most MAX_IMAGES_PER_CALL images."""
    images: list[Image.Image] = []
    for start in range(0, len(jobs), MAX_IMAGES_PER_CALL):
        chunk = jobs[start : start + MAX_IMAGES_PER_CALL]
        arguments = {
            **options,
            "prompt": [j.prompt for j in chunk],
            "generator": [j.generator for j in chunk],
        }
        if chunk[0].negative_prompt is not None:
            arguments["negative_prompt"] = [j.negative_prompt for j in chunk]
        if chunk[0].image is not None:
            arguments["image"] = [j.image for j in chunk]
        if chunk[0].mask is not None:
            arguments["mask_image"] = [j.mask for j in chunk]
        images.extend(pipeline(**arguments, output_type="pil").images)
    return images


def deliver(
    batch: list[dict[str, Any]], outputs: list[dict[str, Any]], jobs: list[Job], images: list[Image.Image]
) -> None:
    """Encode each item's images in its own format: `{images, width, height, content_type}`."""
    mine: dict[int, list[Image.Image]] = {}
    for job, image in zip(jobs, images, strict=True):
        mine.setdefault(job.item, []).append(image)
    for i, made in mine.items():
        fmt = batch[i]["output_format"]
        outputs[i] = {
            "images": [encode_image(image, fmt) for image in made],
            "width": made[0].width,
            "height": made[0].height,
            "content_type": IMAGE_FORMATS[fmt][1],
        }


def options_of(item: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    return {f: item[f] for f in fields if item.get(f) is not None}
