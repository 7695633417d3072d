"""Extractive question answering: the span of the context that answers the question, as transformers'
question-answering pipeline found it (transformers 5 ships no such pipeline, so the model runs here).

Each (question, context) pair is tokenized as one or more windows over the context (`doc_stride` tokens
of overlap, so an answer cut by one window is whole in the next); in each window the start and end
logits of the context's tokens (and of the first, "no answer", token) become probabilities, a span
scores start × end probability, spans end after they start and are at most `max_answer_len` tokens
long, and the best `top_k` spans of all windows are answered as characters of the context. With
`handle_impossible_answer` the "no answer" score competes as the answer `""` at 0–0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from modelhost.engines import loader
from modelhost.engines.encoders import EncoderSlot
from modelhost.errors import item_error
from modelhost.tasks.classify import Classifier, classifier_slot

DOC_STRIDE = 128  # the pipeline's default overlap between windows, in tokens


class QuestionAnswering:
    def load(self, model_dir: Path, device: str) -> Classifier:
        model = loader.load_auto(model_dir, device, "AutoModelForQuestionAnswering")
        return Classifier(model, loader.load_tokenizer(model_dir), device)

    def warmup_item(self) -> dict[str, Any]:
        return {"pairs": [["what?", "modelhost warm-up"]]}

    def encoder_slot(self, state: Classifier) -> EncoderSlot:
        return classifier_slot(state, ("start_logits", "end_logits"))

    @torch.inference_mode()
    def run(self, model: Classifier, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = []
        for item in batch:
            try:
                outputs.append({"results": [_answers(model, q, c, item) for q, c in item["pairs"]]})
            except QuestionTooLong as exc:
                outputs.append(item_error(str(exc), "question"))
        return outputs


class QuestionTooLong(Exception):
    """The question alone fills the model's context: no room is left for any of the context."""


def _answers(model: Classifier, question: str, context: str, item: dict[str, Any]) -> list[dict[str, Any]]:
    tokenizer = model.processor
    limit = min(int(getattr(tokenizer, "model_max_length", 512) or 512), 4096)
    stride = min(DOC_STRIDE, max(limit // 4, 1))
    question_tokens = len(tokenizer(question, add_special_tokens=True)["input_ids"])
    if question_tokens + stride + 2 >= limit:
        raise QuestionTooLong(
            f"The question is {question_tokens} tokens; this model reads {limit} tokens of question and "
            "context together: shorten the question."
        )
    encoded = tokenizer(
        question,
        context,
        truncation="only_second",
        max_length=limit,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding=True,
        return_tensors="pt",
    )
    offsets = encoded.pop("offset_mapping").tolist()
    encoded.pop("overflow_to_sample_mapping", None)
    out = model.model(**encoded.to(model.device))
    starts, ends = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
    max_len, top_k = int(item.get("max_answer_len") or 15), int(item.get("top_k") or 1)
    candidates: list[tuple[float, int, int]] = []  # (score, start char, end char)
    null_score = 1.0
    for window in range(starts.shape[0]):
        in_context = np.array([s == 1 for s in encoded.sequence_ids(window)])
        start_p, end_p = _probabilities(starts[window], in_context), _probabilities(ends[window], in_context)
        null_score = min(null_score, float(start_p[0] * end_p[0]))
        start_p[0] = end_p[0] = 0.0
        scores = np.triu(np.outer(start_p, end_p)) - np.triu(np.outer(start_p, end_p), k=max_len)
        for flat in np.argsort(-scores, axis=None)[:top_k]:
            first, last = np.unravel_index(flat, scores.shape)
            if scores[first, last] <= 0 or not (in_context[first] and in_context[last]):
                continue
            candidates.append(
                (float(scores[first, last]), offsets[window][first][0], offsets[window][last][1])
            )
    if item.get("handle_impossible_answer"):
        candidates.append((null_score, 0, 0))
    best: dict[tuple[int, int], float] = {}
    for score, start, end in sorted(candidates, reverse=True):
        best.setdefault((start, end), score)  # a span found in two windows counts once, at its best
    ranked = sorted(best.items(), key=lambda pair: -pair[1])[:top_k]
    return [{"answer": context[s:e], "score": score, "start": s, "end": e} for (s, e), score in ranked]


def _probabilities(logits: np.ndarray, in_context: np.ndarray) -> np.ndarray:
    """Softmax over the context's tokens and the first ("no answer") token; the rest get 0."""
    allowed = in_context.copy()
    allowed[0] = True
    masked = np.where(allowed, logits, -np.inf)
    exp = np.exp(masked - masked.max())
    probabilities: np.ndarray = exp / exp.sum()
    return probabilities
