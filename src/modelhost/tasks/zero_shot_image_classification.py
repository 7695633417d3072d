"""Zero-shot image classification (§4.5) on the transformers pipeline: items with equal candidate labels
and template share one call over all their images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelhost.engines import loader
from modelhost.tasks.base import grouped
from modelhost.tasks.image_batches import decoded_images, image_warmup_item, spread_results

DEFAULT_HYPOTHESIS = "This is a photo of {}."


class ZeroShotImageClassification:
    def load(self, model_dir: Path, device: str) -> Any:
        return loader.load_pipeline("zero-shot-image-classification", model_dir, device)

    def warmup_item(self) -> dict[str, Any]:
        return image_warmup_item(candidate_labels=["a", "b"], hypothesis_template=None)

    def run(self, model: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        decoded = decoded_images(batch, outputs, name="image")
        fields = ("candidate_labels", "hypothesis_template")
        for indices in grouped(batch, fields).values():
            ready = [i for i in indices if i in decoded]
            if not ready:
                continue
            first = batch[ready[0]]
            pictures = [p for i in ready for p in decoded[i]]
            results = model(
                pictures,
                candidate_labels=first["candidate_labels"],
                hypothesis_template=first.get("hypothesis_template") or DEFAULT_HYPOTHESIS,
                batch_size=len(pictures),
            )
            spread_results(results, ready, decoded, outputs)
        return outputs
