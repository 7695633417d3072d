"""Image feature extraction (§4.11): one vector per image, in one model call per batch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from modelhost.engines import loader
from modelhost.engines.encoders import EncoderSlot, ImageInputs
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
    def encoder_slot(self, state: Vision) -> EncoderSlot:
        """The model, for a runtime to replace: what `run` reads of it, the pooled output where the
        model has a pooler, else the last hidden state."""

        def replace(model: torch.nn.Module) -> None:
            state.model = model

        inputs = ImageInputs(state.processor)
        sample = state.model(**inputs.encode(1))
        pooled = getattr(sample, "pooler_output", None) is not None
        outputs = ("pooler_output",) if pooled else ("last_hidden_state",)
        return EncoderSlot(state.model, outputs, inputs, replace)

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
