"""Text classification: a sequence-classification model's labels per text or text pair.

The model runs directly (tokenizer → model → `function_to_apply` → top labels), as the pipeline does,
so that every item's texts join one padded model call; pairs are tokenized as pairs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from modelhost.engines import loader
from modelhost.engines.encoders import EncoderSlot
from modelhost.tasks.classify import Classifier, classifier_slot, scores_of, top_labels


def text_and_pair(value: Any) -> tuple[str, str | None]:
    """A text, or a `{text, text_pair}` pair."""
    if isinstance(value, dict):
        return value["text"], value["text_pair"]
    return value, None


class TextClassification:
    def load(self, model_dir: Path, device: str) -> Classifier:
        model = loader.load_auto(model_dir, device, "AutoModelForSequenceClassification")
        return Classifier(model, loader.load_tokenizer(model_dir), device)

    def warmup_item(self) -> dict[str, Any]:
        return {"inputs": ["modelhost warm-up"], "top_k": 1}

    def encoder_slot(self, state: Classifier) -> EncoderSlot:
        return classifier_slot(state)

    @torch.inference_mode()
    def run(self, model: Classifier, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        inputs = [text_and_pair(value) for item in batch for value in item["inputs"]]
        logits = _logits(model, inputs)
        outputs: list[dict[str, Any]] = []
        start = 0
        labels = model.model.config.id2label
        for item in batch:
            rows = logits[start : start + len(item["inputs"])]
            start += len(item["inputs"])
            scores = scores_of(rows, item.get("function_to_apply"), model.model.config)
            top_k = item.get("top_k") or len(labels)  # null: every label
            outputs.append({"results": [top_labels(row, labels, top_k) for row in scores]})
        return outputs


def _logits(model: Classifier, inputs: list[tuple[str, str | None]]) -> torch.Tensor:
    """One padded model call per kind: texts and pairs are tokenized apart (a tokenizer call takes one)."""
    singles = [i for i, (_, pair) in enumerate(inputs) if pair is None]
    pairs = [i for i, (_, pair) in enumerate(inputs) if pair is not None]
    rows: dict[int, torch.Tensor] = {}
    for indices, with_pair in ((singles, False), (pairs, True)):
        if not indices:
            continue
        texts = [inputs[i][0] for i in indices]
        second = [inputs[i][1] for i in indices] if with_pair else None
        encoded = model.processor(texts, second, padding=True, truncation=True, return_tensors="pt")
        out = model.model(**encoded.to(model.device)).logits.float().cpu()
        rows.update(zip(indices, out, strict=True))
    return torch.stack([rows[i] for i in range(len(inputs))])
