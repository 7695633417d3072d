"""Fill-mask (§4.8) on the transformers pipeline: items with equal options share one call over all
their inputs (the pipeline batches them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelhost.engines import loader
from modelhost.engines.encoders import EncoderSlot, pipeline_slot
from modelhost.errors import item_error, param_name
from modelhost.tasks.base import grouped
from modelhost.tasks.outputs import plain


class FillMask:
    def load(self, model_dir: Path, device: str) -> Any:
        return loader.load_pipeline("fill-mask", model_dir, device)

    def warmup_item(self) -> dict[str, Any]:
        return {"inputs": [], "warmup": True, "targets": None, "top_k": None}

    def encoder_slot(self, state: Any) -> EncoderSlot:
        """The pipeline's model, for a runtime to replace (a logit per token and word)."""
        return pipeline_slot(state, per_token=True)

    def run(self, model: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        mask = model.tokenizer.mask_token
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        for indices in grouped(batch, ("targets", "top_k")).values():
            ready: list[int] = []
            for i in indices:
                if batch[i].get("warmup"):  # the warm-up item cannot know the model's mask token
                    batch[i]["inputs"] = [f"hello {mask}"]
                texts = batch[i]["inputs"]
                missing = next((n for n, t in enumerate(texts) if mask not in t), None)
                if missing is not None:
                    where = param_name("inputs", missing, len(texts))
                    outputs[i] = item_error(f"The input must contain the mask token {mask}.", where)
                else:
                    ready.append(i)
            if ready:
                self._run_group(model, batch, ready, outputs)
        return outputs

    def _run_group(
        self, model: Any, batch: list[dict[str, Any]], indices: list[int], outputs: list[dict[str, Any]]
    ) -> None:
        options = {k: batch[indices[0]][k] for k in ("targets", "top_k") if batch[indices[0]].get(k)}
        texts = [text for i in indices for text in batch[i]["inputs"]]
        try:
            results = model(texts, batch_size=len(texts), **options)
        except ValueError as exc:  # a target the vocabulary cannot express
            for i in indices:
                outputs[i] = item_error(f"Invalid targets: {exc}", "targets")
            return
        if results and isinstance(results[0], dict):  # one text with one mask: not nested
            results = [results]
        start = 0
        for i in indices:
            count = len(batch[i]["inputs"])
            outputs[i] = {"results": plain(results[start : start + count])}
            start += count
