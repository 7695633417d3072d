"""Zero-shot text classification on transformers' `zero-shot-classification` pipeline: an NLI model
(a sequence classifier with an `entailment` label) scores "this text entails: <hypothesis with the
label>" for every candidate label. Items with equal labels, template and `multi_label` share one call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelhost.engines import loader
from modelhost.engines.encoders import EncoderSlot, pipeline_slot
from modelhost.tasks.base import grouped
from modelhost.tasks.outputs import plain

DEFAULT_HYPOTHESIS = "This example is {}."  # the pipeline's
OPTIONS = ("candidate_labels", "hypothesis_template", "multi_label")


class ZeroShotTextClassification:
    def load(self, model_dir: Path, device: str) -> Any:
        pipe = loader.load_pipeline("zero-shot-classification", model_dir, device)
        if pipe.entailment_id == -1:
            labels = ", ".join(map(str, pipe.model.config.label2id))
            # the deployment fails to load with this reason (its state says it)
            raise ValueError(
                "zero-shot classification needs an NLI model with an `entailment` label; "
                f"this one has {labels}"
            )
        return pipe

    def warmup_item(self) -> dict[str, Any]:
        return {"inputs": ["modelhost warm-up"], "candidate_labels": ["a", "b"]}

    def encoder_slot(self, state: Any) -> EncoderSlot:
        """The pipeline's model, for a runtime to replace (the NLI logits of each (text, hypothesis) pair)."""
        return pipeline_slot(state, per_token=False)

    def run(self, model: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        for indices in grouped(batch, OPTIONS).values():
            first = batch[indices[0]]
            texts = [text for i in indices for text in batch[i]["inputs"]]
            results = model(
                texts,
                candidate_labels=first["candidate_labels"],
                hypothesis_template=first.get("hypothesis_template") or DEFAULT_HYPOTHESIS,
                multi_label=bool(first.get("multi_label")),
            )
            results = results if isinstance(results, list) else [results]
            start = 0
            for i in indices:
                count = len(batch[i]["inputs"])
                outputs[i] = {"results": plain(results[start : start + count])}
                start += count
        return outputs
