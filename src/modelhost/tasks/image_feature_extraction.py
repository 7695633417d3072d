"""Image feature extraction (§4.11): one vector per image, in one model call per batch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from modelhost.tasks import loader
from modelhost.tasks.image_batches import every_picture, image_warmup_item, spread_results


@dataclass
class Vision:
    model: Any
    processor: Any
    device: str


class ImageFeatureExtraction:
    """One vector per image: the model's pooled output, or the mean of its last hidden state."""

    def load(self, model_dir: Path, device: str) -> Vision:
        return Vision(loader.load_auto(model_dir, device), loader.load_image_processor(model_dir), device)

    def warmup_item(self) -> dict[str, Any]:
        return image_warmup_item()

    @torch.inference_mode()
    def run(self, model: Vision, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs, decoded, pictures = every_picture(batch)
        if not pictures:
            return outputs
        pixels = model.processor(images=pictures, return_tensors="pt")["pixel_values"].to(model.device)
        result = model.model(pixel_values=pixels)
        pooled = getattr(result, "pooler_output", None)
        vectors = pooled if pooled is not None else result.last_hidden_state.mean(dim=1)
        spread_results(vectors.float().cpu().tolist(), list(decoded), decoded, outputs)
        return outputs
