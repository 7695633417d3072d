"""Text feature extraction and embeddings: one vector per input.

Sentence-transformers artifacts (with `modules.json`) give their sentence embedding (pooling and
normalisation as the model defines); plain transformers encoders give the attention-masked mean of
the last hidden state. Inputs are strings or token-ID lists; each request reports its token count.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from modelhost.engines import loader
from modelhost.engines.encoders import EncoderSlot, TextInputs
from modelhost.engines.text_inputs import TokenRules, checked, framing_of
from modelhost.tasks.tokens import BatchEncoder, batch_encoder

CHUNK = 128  # sequences per forward pass: bounds activation memory for very large requests


@dataclass
class Encoder:
    model: Any
    tokenizer: Any
    sentence_transformer: bool
    max_tokens: int
    vocab_size: int
    device: str
    uses_token_types: bool
    encode: BatchEncoder  # texts → their token IDs, special tokens included (`tasks.tokens`)
    framing: tuple[list[int], list[int]] = ([], [])  # special tokens the tokenizer puts around a text


class FeatureExtraction:
    pipeline = "feature-extraction"

    def load(self, model_dir: Path, device: str) -> Encoder:
        if loader.is_sentence_transformer(model_dir):
            model = loader.load_sentence_transformer(model_dir, device)
            tokenizer = model.tokenizer
            max_tokens = int(model.max_seq_length or tokenizer.model_max_length)
            config = model[0].auto_model.config
            st = True
        else:
            model = loader.load_auto(model_dir, device)
            tokenizer = loader.load_tokenizer(model_dir)
            config = model.config
            max_tokens = min(
                int(tokenizer.model_max_length), int(getattr(config, "max_position_embeddings", 512))
            )
            st = False
        return Encoder(
            model=model,
            tokenizer=tokenizer,
            sentence_transformer=st,
            max_tokens=max_tokens,
            vocab_size=int(config.vocab_size),
            device=device,
            uses_token_types="token_type_ids" in tokenizer.model_input_names,
            encode=batch_encoder(tokenizer),
            framing=_framing(tokenizer),
        )

    def warmup_item(self) -> dict[str, Any]:
        return {"inputs": ["modelhost warm-up"]}

    def encoder_slot(self, state: Encoder) -> EncoderSlot:
        """The transformer a runtime may replace (`engines.encoders`): a sentence-transformers
        model's first module's, whose pooling and normalization stay in torch, or the plain model."""

        def replace(model: torch.nn.Module) -> None:
            if state.sentence_transformer:
                state.model[0].model = model
            else:
                state.model = model

        transformer = state.model[0].model if state.sentence_transformer else state.model
        inputs = TextInputs(state.tokenizer, state.max_tokens)
        return EncoderSlot(transformer, ("last_hidden_state",), inputs, replace)

    def run(self, model: Encoder, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        ids_per_item = self._token_ids(model, batch)
        sequences = [seq for ids in ids_per_item if isinstance(ids, list) for seq in ids]
        vectors = self._embed(model, sequences) if sequences else np.zeros((0, 0), dtype=np.float32)
        outputs: list[dict[str, Any]] = []
        start = 0
        for ids in ids_per_item:
            if isinstance(ids, dict):
                outputs.append(ids)
                continue
            block = np.ascontiguousarray(vectors[start : start + len(ids)], dtype="<f4")
            start += len(ids)
            outputs.append(
                {"vectors": block.tobytes(), "count": len(ids), "dim": int(block.shape[1]),
                 "tokens": sum(len(s) for s in ids)}
            )  # fmt: skip
        return outputs

    def _token_ids(
        self, model: Encoder, batch: list[dict[str, Any]]
    ) -> list[list[list[int]] | dict[str, Any]]:
        """Each request's token IDs per input, or that request's error. Every text of the batch goes
        through the tokenizer in one call (much cheaper than one call per request)."""
        texts = [
            (b, i, x)
            for b, item in enumerate(batch)
            for i, x in enumerate(item["inputs"])
            if isinstance(x, str)
        ]
        encoded = model.encode([x for _, _, x in texts]) if texts else []
        ids: list[list[list[int]]] = [
            [x if isinstance(x, list) else [] for x in item["inputs"]] for item in batch
        ]
        for (b, i, _), token_ids in zip(texts, encoded, strict=True):
            ids[b][i] = token_ids
        return [
            self._checked(model, item["inputs"], item_ids) for item, item_ids in zip(batch, ids, strict=True)
        ]

    def _checked(
        self, model: Encoder, inputs: list[str | list[int]], ids: list[list[int]]
    ) -> list[list[int]] | dict[str, Any]:
        return checked(TokenRules(model.max_tokens, model.vocab_size, model.framing), inputs, ids)

    @torch.inference_mode()
    def _embed(self, model: Encoder, sequences: list[list[int]]) -> np.ndarray:
        """Embed in length-sorted chunks (little padding), then restore the original order."""
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        result: np.ndarray | None = None
        for begin in range(0, len(order), CHUNK):
            chosen = order[begin : begin + CHUNK]
            features = self._pad(model, [sequences[i] for i in chosen])
            if model.sentence_transformer:
                embedded = model.model.forward(features)["sentence_embedding"]
            else:
                hidden = model.model(**features).last_hidden_state
                mask = features["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                embedded = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            block = embedded.float().cpu().numpy()
            if result is None:
                result = np.empty((len(sequences), block.shape[1]), dtype=np.float32)
            result[chosen] = block
        assert result is not None
        return result

    def _pad(self, model: Encoder, sequences: list[list[int]]) -> dict[str, torch.Tensor]:
        width = max(len(s) for s in sequences)
        pad_id = model.tokenizer.pad_token_id or 0
        input_ids = np.full((len(sequences), width), pad_id, dtype=np.int64)
        attention = np.zeros((len(sequences), width), dtype=np.int64)
        for row, seq in enumerate(sequences):
            input_ids[row, : len(seq)] = seq
            attention[row, : len(seq)] = 1
        features = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention)}
        if model.uses_token_types:
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
        return {k: v.to(model.device) for k, v in features.items()}


def _framing(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a text (BERT: `[CLS]` … `[SEP]`)."""
    bare = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    return framing_of(bare, list(tokenizer("a", add_special_tokens=True)["input_ids"]))
