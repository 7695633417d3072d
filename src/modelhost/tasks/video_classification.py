"""Video classification (§4.6): decode the frames, one model call per group of equal frame counts,
top-k labels.

The model runs directly rather than through the pipeline, which reads files itself; decoding happens in
`modelhost.media.decode`, with our limits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from modelhost.engines import loader
from modelhost.errors import item_error
from modelhost.tasks import media_items
from modelhost.tasks.base import grouped
from modelhost.tasks.classify import Classifier, classify
from modelhost.tasks.media_items import ItemError


class VideoClassification:
    def load(self, model_dir: Path, device: str) -> Classifier:
        from transformers import AutoModelForVideoClassification

        model = AutoModelForVideoClassification.from_pretrained(str(model_dir), **loader.SAFE_LOAD)
        return Classifier(model.to(device).eval(), loader.load_image_processor(model_dir), device)

    def warmup_item(self) -> dict[str, Any]:
        return {}

    @torch.inference_mode()
    def run(self, model: Classifier, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        default_frames = int(getattr(model.model.config, "num_frames", 16))
        for indices in grouped(batch, ("num_frames", "frame_sampling_rate")).values():
            first = batch[indices[0]]
            if "videos" not in first:  # warm-up: nothing to decode
                continue
            frames, rate = first.get("num_frames") or default_frames, first.get("frame_sampling_rate") or 1
            decoded: dict[int, list[Any]] = {}
            for i in indices:
                try:
                    decoded[i] = media_items.videos(batch[i], frames, rate)
                except ItemError as exc:
                    outputs[i] = exc.output
            if not decoded:
                continue
            # Equal frame counts give equal tensor shapes: one model call for the whole group.
            clips = [clip for i in decoded for clip in decoded[i]]
            pixels = model.processor(clips, return_tensors="pt")["pixel_values"].to(model.device)
            try:
                logits = model.model(pixel_values=pixels).logits
            except (RuntimeError, ValueError) as exc:  # models with a fixed frame count
                for i in decoded:
                    outputs[i] = item_error(f"This model cannot take {frames} frames: {exc}", "num_frames")
                continue
            start = 0
            for i, videos in decoded.items():
                outputs[i] = {"results": classify(model, logits[start : start + len(videos)], batch[i])}
                start += len(videos)
        return outputs
