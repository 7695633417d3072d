"""Audio classification (§4.10): decode, run the model on each clip list, top-k labels.

The model runs directly rather than through the pipeline: the audio pipeline shells out to an `ffmpeg`
program for bytes and resamples with torchaudio (neither usable here). Decoding happens in
`modelhost.media.decode`, with our limits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from modelhost.engines import loader
from modelhost.errors import item_error
from modelhost.tasks import media_items
from modelhost.tasks.classify import Classifier, classify
from modelhost.tasks.media_items import ItemError


class AudioClassification:
    def load(self, model_dir: Path, device: str) -> Classifier:
        from transformers import AutoFeatureExtractor, AutoModelForAudioClassification

        model = AutoModelForAudioClassification.from_pretrained(str(model_dir), **loader.SAFE_LOAD)
        extractor = AutoFeatureExtractor.from_pretrained(str(model_dir), **loader.SAFE_LOAD)
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
            outputs[i] = {"results": classify(model, logits, item)}
        return outputs
