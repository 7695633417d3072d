"""Image segmentation (§4.4) on the transformers pipeline: items with equal options share one call;
masks travel as base64 PNGs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelhost.engines import loader
from modelhost.errors import item_error
from modelhost.tasks.base import grouped
from modelhost.tasks.image_batches import decoded_images, image_warmup_item, spread_results
from modelhost.tasks.outputs import png_base64

SEGMENTATION_OPTIONS = ("subtask", "threshold", "mask_threshold", "overlap_mask_area_threshold")


class ImageSegmentation:
    def load(self, model_dir: Path, device: str) -> Any:
        return loader.load_pipeline("image-segmentation", model_dir, device)

    def warmup_item(self) -> dict[str, Any]:
        return image_warmup_item()

    def run(self, model: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        decoded = decoded_images(batch, outputs)
        for indices in grouped(batch, SEGMENTATION_OPTIONS).values():
            ready = [i for i in indices if i in decoded]
            if not ready:
                continue
            options = {
                k: batch[ready[0]][k] for k in SEGMENTATION_OPTIONS if batch[ready[0]].get(k) is not None
            }
            pictures = [p for i in ready for p in decoded[i]]
            try:
                segments = model(pictures, **options)
            except ValueError as exc:  # e.g. a subtask this model cannot do
                for i in ready:
                    outputs[i] = item_error(f"This model cannot segment that way: {exc}", "subtask")
                continue
            if segments and isinstance(segments[0], dict):  # one image: one list of segments
                segments = [segments]
            spread_results([_masks(s) for s in segments], ready, decoded, outputs)
        return outputs


def _masks(segments: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "masks": [png_base64(s["mask"]) for s in segments],
        "scores": [None if s.get("score") is None else float(s["score"]) for s in segments],
        "labels": [s.get("label") for s in segments],
    }
