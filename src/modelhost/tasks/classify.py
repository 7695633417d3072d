"""Classification outputs: logits → the top `k` `{label, score}` pairs, with `function_to_apply` as
transformers defines it; shared by the audio and video classification handlers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from modelhost.engines.encoders import EncoderSlot, TextInputs, max_tokens


def scores_of(logits: torch.Tensor, function: str | None, config: Any) -> torch.Tensor:
    """`softmax`, `sigmoid` or `none` (raw logits). Default: sigmoid for multi-label or single-output
    models, softmax otherwise (the pipelines' rule)."""
    if function is None:
        multi = getattr(config, "problem_type", None) == "multi_label_classification"
        function = "sigmoid" if multi or logits.shape[-1] == 1 else "softmax"
    if function == "softmax":
        return logits.float().softmax(-1)
    if function == "sigmoid":
        return logits.float().sigmoid()
    return logits.float()


def top_labels(scores: torch.Tensor, id2label: dict[int, str], top_k: int | None) -> list[dict[str, Any]]:
    """One row of scores → `[{label, score}]`, best first, at most `top_k` (default 5, as the pipelines)."""
    k = min(top_k or 5, scores.shape[-1])
    values, indices = scores.topk(k)
    return [
        {"label": id2label[int(i)], "score": float(v)}
        for v, i in zip(values.tolist(), indices.tolist(), strict=True)
    ]


@dataclass
class Classifier:
    """A classification model with its feature extractor or image processor."""

    model: Any
    processor: Any
    device: str


def classifier_slot(state: Classifier, outputs: tuple[str, ...] = ("logits",)) -> EncoderSlot:
    """A classifier (sequence, cross-encoder, extractive QA) whose `outputs` a runtime may compute
    instead of torch (`engines.encoders`); labels and scoring stay with the config the handler
    reads."""

    def replace(model: torch.nn.Module) -> None:
        state.model = model

    inputs = TextInputs(state.processor, max_tokens(state.processor, state.model.config))
    return EncoderSlot(state.model, outputs, inputs, replace)


def classify(model: Classifier, logits: torch.Tensor, item: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """A batch of logits → the item's top labels per row, with its `function_to_apply` and `top_k`."""
    scores = scores_of(logits, item.get("function_to_apply"), model.model.config)
    return [top_labels(row, model.model.config.id2label, item.get("top_k")) for row in scores]
