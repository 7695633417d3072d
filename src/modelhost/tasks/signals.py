"""Audio (§4.10) and video (§4.6) classification: decode, run the model on the batch, top-k labels.

Both run the model directly rather than through the pipelines: the audio pipeline shells out to an
`ffmpeg` program for bytes and resamples with torchaudio (neither usable here), and the video
pipeline reads files itself. Decoding happens in `modelhost.media.decode`, with our limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from modelhost.tasks import loader, media_items
from modelhost.tasks.base import grouped, item_error
from modelhost.tasks.classify import scores_of, top_labels
from modelhost.tasks.media_items import ItemError


@dataclass
class Classifier:
    model: Any
    processor: Any
    device: str


def _classify(model: Classifier, logits: torch.Tensor, item: dict[str, Any]) -> list[list[dict[str, Any]]]:
    scores = scores_of(logits, item.get("function_to_apply"), model.model.config)
    return [top_labels(row, model.model.config.id2label, item.get("top_k")) for row in scores]


class AudioClassification:
    def load(self, model_dir: Path, device: str) -> Classifier:
        from transformers import AutoFeatureExtractor, AutoModelForAudioClassification

        model = AutoModelForAudioClassification.from_pretrained(str(model_dir), **loader.SAFE_LOAD)
        extractor = AutoFeatureExtractor.from_pretrained(str(model_dir), **loader.SAFE_LOAD)  # type: ignore[no-untyped-call]
        return Classifier(model.to(device).eval(), extractor, device)

    def warmup_item(self) -> dict[str, Any]:
        silence = bytes(4 * 16000)
        return {"audios": [{"samples": silence, "sampling_rate": 16000}], "limits": media_items.WARMUP_LIMITS}

    @torch.inference_mode()
    def run(self, model: Classifier, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rate = int(model.processor.sampling_rate)
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        for i, item in enumerate(batch):  # clips differ in length: one call per request
            try:
                clips = media_items.audios(item, rate)
            except ItemError as exc:
                outputs[i] = exc.output
                continue
            features = model.processor(
                clips, sampling_rate=rate, return_tensors="pt", padding=True, return_attention_mask=True
            ).to(model.device)
            try:
                logits = model.model(**features).logits
            except (RuntimeError, ValueError) as exc:  # e.g. a clip too short for the model's filters
                outputs[i] = item_error(f"The model cannot classify this audio: {exc}", "inputs")
                continue
            outputs[i] = {"results": _classify(model, logits, item)}
        return outputs


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
                outputs[i] = {"results": _classify(model, logits[start : start + len(videos)], batch[i])}
                start += len(videos)
        return outputs
