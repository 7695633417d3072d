"""Object detection on transformers' `object-detection` pipeline: `{label, score, box}` per object above
`threshold`, boxes in pixels of the image as sent. Items with equal thresholds share one call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelhost.engines import loader
from modelhost.tasks.base import grouped
from modelhost.tasks.image_batches import decoded_images, image_warmup_item, spread_results


class ObjectDetection:
    def load(self, model_dir: Path, device: str) -> Any:
        return loader.load_pipeline("object-detection", model_dir, device)

    def warmup_item(self) -> dict[str, Any]:
        return image_warmup_item()

    def run(self, model: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        decoded = decoded_images(batch, outputs)
        for indices in grouped(batch, ("threshold",)).values():
            ready = [i for i in indices if i in decoded]
            if not ready:
                continue
            threshold = batch[ready[0]].get("threshold", 0.5)
            pictures = [p for i in ready for p in decoded[i]]
            results = model(pictures, threshold=threshold, batch_size=len(pictures))
            if results and isinstance(results[0], dict):  # one image: one list of objects
                results = [results]
            spread_results(results, ready, decoded, outputs)
        return outputs
