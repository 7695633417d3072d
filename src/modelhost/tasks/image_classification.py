"""Image classification on transformers' `image-classification` pipeline: items with equal `top_k` and
`function_to_apply` share one call over all their images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelhost.engines import loader
from modelhost.engines.encoders import EncoderSlot, pipeline_slot
from modelhost.tasks.base import grouped
from modelhost.tasks.image_batches import decoded_images, image_warmup_item, spread_results

OPTIONS = ("top_k", "function_to_apply")


class ImageClassification:
    def load(self, model_dir: Path, device: str) -> Any:
        return loader.load_pipeline("image-classification", model_dir, device)

    def warmup_item(self) -> dict[str, Any]:
        return image_warmup_item()

    def encoder_slot(self, state: Any) -> EncoderSlot:
        """The pipeline's model, for a runtime to replace (the logits of each image)."""
        return pipeline_slot(state, per_token=False)

    def run(self, model: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        decoded = decoded_images(batch, outputs)
        labels = len(model.model.config.id2label)
        for indices in grouped(batch, OPTIONS).values():
            ready = [i for i in indices if i in decoded]
            if not ready:
                continue
            first = batch[ready[0]]
            options = {"top_k": min(first.get("top_k") or 5, labels)}  # the pipeline's default, 5
            if first.get("function_to_apply") is not None:
                options["function_to_apply"] = first["function_to_apply"]
            pictures = [p for i in ready for p in decoded[i]]
            results = model(pictures, batch_size=len(pictures), **options)
            spread_results(results, ready, decoded, outputs)
        return outputs
