"""Token classification (§4.1) on the transformers pipeline: items with equal options share one call over
all their inputs (the pipeline batches them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelhost.engines import loader
from modelhost.engines.encoders import EncoderSlot, pipeline_slot
from modelhost.tasks.base import grouped
from modelhost.tasks.outputs import plain


class TokenClassification:
    def load(self, model_dir: Path, device: str) -> Any:
        return loader.load_pipeline("token-classification", model_dir, device)

    def warmup_item(self) -> dict[str, Any]:
        return {"inputs": ["modelhost warm-up"], "aggregation_strategy": None}

    def encoder_slot(self, state: Any) -> EncoderSlot:
        """The pipeline's model, for a runtime to replace (a logit per token and label)."""
        return pipeline_slot(state, per_token=True)

    def run(self, model: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        for indices in grouped(batch, ("aggregation_strategy",)).values():
            strategy = batch[indices[0]].get("aggregation_strategy") or "none"
            texts = [text for i in indices for text in batch[i]["inputs"]]
            results = model(texts, aggregation_strategy=strategy, batch_size=len(texts))
            start = 0
            for i in indices:
                count = len(batch[i]["inputs"])
                chunk = results[start : start + count]
                start += count
                outputs[i] = {"results": [[_entity(e) for e in entities] for entities in chunk]}
        return outputs


def _entity(entity: dict[str, Any]) -> dict[str, Any]:
    """The spec's field set; grouped entities (aggregation) name their group `entity` too."""
    shaped: dict[str, Any] = plain(entity)
    if "entity_group" in shaped:
        shaped["entity"] = shaped["entity_group"]
    return shaped
