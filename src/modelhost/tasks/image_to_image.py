"""Image to image (OpenAI's `/v1/images/edits` without a mask) on a diffusers pipeline: items with equal
options and sizes share pipeline calls (see `tasks.diffusion`)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from modelhost.engines import loader
from modelhost.errors import ModelhostError, error_of, item_error
from modelhost.media.image import decode_image
from modelhost.tasks import media_items
from modelhost.tasks.diffusion import (
    AUTO_PIPELINES,
    Job,
    call_defaults,
    deliver,
    fitted,
    generators,
    grouped_indices,
    make_images,
    mask_for,
    options_of,
    refusal,
    sharing_key,
)
from modelhost.tasks.media_items import ItemError


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
            return (*sharing_key(batch[i], i, EDIT_OPTIONS), job.image.size, job.mask is None)

        for indices in grouped_indices(jobs, key):
            first = batch[indices[0]]
            try:
                pipeline = model.get("image-to-image" if first.get("mask") is None else "inpainting")
            except ValueError:
                failure = item_error("This model cannot inpaint: send the edit without a mask.", "mask")
                for i in indices:
                    outputs[i] = failure
                continue
            options = options_of(first, EDIT_OPTIONS)
            refused = refusal(pipeline, options, first.get("negative_prompt") is not None)
            refused = refused or _too_few_steps(pipeline, options)
            if refused is not None:
                for i in indices:
                    outputs[i] = refused
                continue
            grouped_jobs = [job for i in indices for job in jobs[i]]
            assert grouped_jobs[0].image is not None
            if {"width", "height"} <= call_defaults(pipeline).keys():  # inpainting would use its default
                options["width"], options["height"] = grouped_jobs[0].image.size
            deliver(batch, outputs, grouped_jobs, make_images(pipeline, grouped_jobs, options))
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
    defaults = call_defaults(pipeline)
    steps = options.get("num_inference_steps", defaults.get("num_inference_steps"))
    strength = options.get("strength", defaults.get("strength"))
    if isinstance(steps, int) and isinstance(strength, float | int) and int(steps * strength) < 1:
        return item_error(
            f"num_inference_steps × strength must be at least 1 (is {steps} × {strength}).", "strength"
        )
    return None
