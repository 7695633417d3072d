"""Text to image (OpenAI's `/v1/images/generations`) on a diffusers pipeline: items with equal options
share pipeline calls (see `tasks.diffusion`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from modelhost.engines import loader
from modelhost.tasks.diffusion import (
    AUTO_PIPELINES,
    Job,
    deliver,
    generators,
    grouped_indices,
    make_images,
    options_of,
    refusal,
    sharing_key,
)

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
        for indices in grouped_indices(
            range(len(batch)), lambda i: sharing_key(batch[i], i, GENERATION_OPTIONS)
        ):
            first = batch[indices[0]]
            options = options_of(first, GENERATION_OPTIONS)
            refused = refusal(model, options, first.get("negative_prompt") is not None)
            if refused is not None:
                for i in indices:
                    outputs[i] = refused
                continue
            jobs = [
                Job(i, batch[i].get("prompt") or "", batch[i].get("negative_prompt"), generator)
                for i in indices
                for generator in generators(batch[i].get("seed"), batch[i]["n"])
            ]
            deliver(batch, outputs, jobs, make_images(model, jobs, options))
        return outputs
