"""Image generation (api.md §4.3) and editing (OpenAI's `/v1/images/edits`) on diffusers pipelines.

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
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from modelhost.errors import ModelhostError
from modelhost.media.decode import decode_image
from modelhost.media.encode import IMAGE_FORMATS, encode_image
from modelhost.protocol.images import SIDE_MAX, SIDE_MIN, SIDE_STEP
from modelhost.tasks import loader, media_items
from modelhost.tasks.base import error_of, item_error, options_key
from modelhost.tasks.media_items import ItemError

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


def _grouped(indices: Iterable[int], key: Callable[[int], Hashable]) -> list[list[int]]:
    groups: dict[Hashable, list[int]] = {}
    for i in indices:
        groups.setdefault(key(i), []).append(i)
    return list(groups.values())


def _sharing_key(item: dict[str, Any], index: int, fields: tuple[str, ...]) -> tuple[Any, ...]:
    """Items with this key in common can share pipeline calls (see the module docstring for seeds).

    A missing negative prompt is not the same as an empty one for every family (SDXL uses zeros)."""
    key = (*options_key(item, fields), item.get("negative_prompt") is None)
    return (*key, index) if item.get("seed") is not None else key


def _call_defaults(pipeline: Any) -> dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(pipeline.__call__).parameters.items()}


def _refusal(pipeline: Any, options: dict[str, Any], negative: bool) -> dict[str, Any] | None:
    """An item error when the model's pipeline does not take an option the request set."""
    accepted = _call_defaults(pipeline)
    for name in [*options, *(["negative_prompt"] if negative else [])]:
        if name not in accepted:
            param = "size" if name in ("width", "height") else name
            return item_error(f"This model's pipeline does not take `{param}`.", param)
    return None


def _make(pipeline: Any, jobs: list[Job], options: dict[str, Any]) -> list[Image.Image]:
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


def _deliver(
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


def _options(item: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    return {f: item[f] for f in fields if item.get(f) is not None}


GENERATION_OPTIONS = ("width", "height", "num_inference_steps", "guidance_scale")


class TextToImage:
    """`text-to-image` deployments. `width`/`height` None is `auto`: the pipeline's default size."""

    def load(self, model_dir: Path, device: str) -> Any:
        return loader.load_diffusers(model_dir, device, AUTO_PIPELINES["text-to-image"])

    def warmup_item(self) -> dict[str, Any]:
        return {"prompt": "", "n": 1, "width": 64, "height": 64, "num_inference_steps": 1, "seed": 0,
                "output_format": "png"}  # fmt: skip

    @torch.inference_mode()
    def run(self, model: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        for indices in _grouped(range(len(batch)), lambda i: _sharing_key(batch[i], i, GENERATION_OPTIONS)):
            first = batch[indices[0]]
            options = _options(first, GENERATION_OPTIONS)
            refused = _refusal(model, options, first.get("negative_prompt") is not None)
            if refused is not None:
                for i in indices:
                    outputs[i] = refused
                continue
            jobs = [
                Job(i, batch[i].get("prompt") or "", batch[i].get("negative_prompt"), generator)
                for i in indices
                for generator in generators(batch[i].get("seed"), batch[i]["n"])
            ]
            _deliver(batch, outputs, jobs, _make(model, jobs, options))
        return outputs


@dataclass
class Editors:
    """An edit deployment's pipelines by task: the one loaded, and the other made from its
    components on first need (an image-to-image deployment inpaints when a mask comes)."""

    pipelines: dict[str, Any]

    def get(self, task: str) -> Any:
        if task not in self.pipelines:
            loaded = next(iter(self.pipelines.values()))
            self.pipelines[task] = loader.derive_diffusers(loaded, AUTO_PIPELINES[task])
        return self.pipelines[task]


EDIT_OPTIONS = ("num_inference_steps", "guidance_scale", "strength")


class ImageToImage:
    """`image-to-image` deployments (and, via `Inpainting`, `inpainting` ones).

    Each input image is edited with the prompt, `n` times, in order; with a mask, by inpainting
    (the one mask serves every image). All images are resized to the requested size, or with
    `auto` to the first image's size fitted to the grid, so that one answer has one size.
    """

    task = "image-to-image"

    def load(self, model_dir: Path, device: str) -> Editors:
        return Editors({self.task: loader.load_diffusers(model_dir, device, AUTO_PIPELINES[self.task])})

    def warmup_item(self) -> dict[str, Any]:
        png = media_items.warmup_png()
        return {"images": [png], "mask": png if self.task == "inpainting" else None, "prompt": "", "n": 1,
                "width": 64, "height": 64, "num_inference_steps": 1, "strength": 1.0, "seed": 0,
                "output_format": "png", "limits": media_items.WARMUP_LIMITS}  # fmt: skip

    @torch.inference_mode()
    def run(self, model: Editors, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        jobs: dict[int, list[Job]] = {}
        for i, item in enumerate(batch):
            try:
                jobs[i] = self._jobs(i, item)
            except ItemError as exc:
                outputs[i] = exc.output

        def key(i: int) -> Hashable:
            job = jobs[i][0]
            assert job.image is not None
            return (*_sharing_key(batch[i], i, EDIT_OPTIONS), job.image.size, job.mask is None)

        for indices in _grouped(jobs, key):
            first = batch[indices[0]]
            try:
                pipeline = model.get("image-to-image" if first.get("mask") is None else "inpainting")
            except ValueError:
                failure = item_error("This model cannot inpaint: send the edit without a mask.", "mask")
                for i in indices:
                    outputs[i] = failure
                continue
            options = _options(first, EDIT_OPTIONS)
            refused = _refusal(pipeline, options, first.get("negative_prompt") is not None)
            refused = refused or _too_few_steps(pipeline, options)
            if refused is not None:
                for i in indices:
                    outputs[i] = refused
                continue
            grouped_jobs = [job for i in indices for job in jobs[i]]
            assert grouped_jobs[0].image is not None
            if {"width", "height"} <= _call_defaults(pipeline).keys():  # inpainting would use its default
                options["width"], options["height"] = grouped_jobs[0].image.size
            _deliver(batch, outputs, grouped_jobs, _make(pipeline, grouped_jobs, options))
        return outputs

    def _jobs(self, index: int, item: dict[str, Any]) -> list[Job]:
        """Decode the item's images and mask (a bad file fails this item alone) into its jobs:
        image 0's `n` results, then image 1's, each with the next seed."""
        pictures = media_items.images(item, name="image")
        width, height = item.get("width"), item.get("height")
        size = (width, height) if width and height else fitted(*pictures[0].size)
        mask = None
        if item.get("mask") is not None:
            try:
                decoded = decode_image(item["mask"], max_pixels=item["limits"]["max_pixels"], param="mask")
            except ModelhostError as exc:
                raise ItemError(error_of(exc)) from exc
            mask = mask_for(decoded, size)
        resized = [picture.resize(size, Image.Resampling.LANCZOS) for picture in pictures]
        n = item["n"]
        seeds = generators(item.get("seed"), n * len(resized))
        return [
            Job(index, item["prompt"], item.get("negative_prompt"), seeds[j * n + c], picture, mask)
            for j, picture in enumerate(resized)
            for c in range(n)
        ]


def _too_few_steps(pipeline: Any, options: dict[str, Any]) -> dict[str, Any] | None:
    """diffusers runs `int(num_inference_steps × strength)` steps of an edit and fails on zero."""
    defaults = _call_defaults(pipeline)
    steps = options.get("num_inference_steps", defaults.get("num_inference_steps"))
    strength = options.get("strength", defaults.get("strength"))
    if isinstance(steps, int) and isinstance(strength, float | int) and int(steps * strength) < 1:
        return item_error(
            f"num_inference_steps × strength must be at least 1 (is {steps} × {strength}).", "strength"
        )
    return None


class Inpainting(ImageToImage):
    """`inpainting` deployments: the gateway refuses an edit without a mask before it comes here."""

    task = "inpainting"
