"""Text ranking (reranking): a cross-encoder's relevance of each document to a query.

A cross-encoder is a sequence-classification model read over the pair (query, document), as
sentence-transformers' `CrossEncoder` saves it. With one output its sigmoid is the relevance score in
[0, 1] (CrossEncoder's default for one label); with more, the probability of the last label (a
classifier of "not relevant / relevant"). Every request of a batch joins one padded model call; a pair
longer than the model takes is cut at the end of the longer of its two texts (usually the document).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from modelhost.engines import loader
from modelhost.engines.encoders import EncoderSlot
from modelhost.tasks.classify import Classifier, classifier_slot


class TextRanking:
    def load(self, model_dir: Path, device: str) -> Classifier:
        model = loader.load_auto(model_dir, device, "AutoModelForSequenceClassification")
        return Classifier(model, loader.load_tokenizer(model_dir), device)

    def warmup_item(self) -> dict[str, Any]:
        return {"query": "modelhost", "documents": ["warm-up"]}

    def encoder_slot(self, state: Classifier) -> EncoderSlot:
        return classifier_slot(state)

    @torch.inference_mode()
    def run(self, model: Classifier, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        queries = [item["query"] for item in batch for _ in item["documents"]]
        documents = [
            _cut(model.processor, document, item.get("max_tokens_per_doc"))
            for item in batch
            for document in item["documents"]
        ]
        encoded = model.processor(
            queries, documents, padding=True, truncation="longest_first", return_tensors="pt"
        )
        scores = _relevance(model.model(**encoded.to(model.device)).logits.float().cpu()).tolist()
        tokens = encoded["attention_mask"].sum(dim=1).tolist()
        outputs: list[dict[str, Any]] = []
        start = 0
        for item in batch:
            end = start + len(item["documents"])
            outputs.append({"scores": scores[start:end], "tokens": int(sum(tokens[start:end]))})
            start = end
        return outputs


def _cut(tokenizer: Any, document: str, limit: int | None) -> str:
    """The document's first `limit` tokens (Cohere's `max_tokens_per_doc`), or all of it."""
    if limit is None:
        return document
    ids = tokenizer(document, add_special_tokens=False)["input_ids"]
    return document if len(ids) <= limit else str(tokenizer.decode(ids[:limit]))


def _relevance(logits: torch.Tensor) -> torch.Tensor:
    if logits.shape[-1] == 1:
        return logits[:, 0].sigmoid()
    return logits.softmax(-1)[:, -1]
