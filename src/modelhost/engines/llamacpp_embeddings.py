"""Embeddings from an embedding GGUF on the `llamacpp` engine: a feature-extraction deployment's
`/v1/embeddings` and `/v1/feature-extraction` answered by llama.cpp's server in embedding mode.

The same server as for text generation (`engines.llamacpp`: its slots, its context per slot, weights read
in, the wheel's or a `llama-server` program), started with `embedding` on, the GGUF's own pooling
(`<arch>.pooling_type`; where it names none, the mean of the tokens, as our engines pool a plain
encoder), and a batch as large as a slot's context (an encoder reads a whole input in one batch: a longer
input than the batch is an error in llama.cpp). Vectors are unit length (llama.cpp's Euclidean
normalization, its default): a GGUF does not say whether its sentence-transformers model normalizes, and
OpenAI's embeddings are unit length.

Each request (a replica protocol `Run`: its inputs) is tokenized by llama.cpp (`/tokenize`, one text at a
time, with the model's special tokens), checked as our other engines check theirs (`engines.text_inputs`:
too long, or a client's token IDs that are not this model's, is the caller's 400 naming the input), then
embedded in one call of llama.cpp's OpenAI endpoint with those token IDs, which spreads its inputs over
the slots. Usage counts those tokens. Requests wait for a slot in the same gate as generations
(`SlotGate`): interactive ones before batch lines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from modelhost.artifacts.gguf_check import read_gguf_set
from modelhost.engines.interface import BatchEngine
from modelhost.engines.llamacpp import SlotGate, error_message, gguf_file
from modelhost.engines.llamacpp_server import Embedding, LlamaCppServer, start
from modelhost.engines.text_inputs import TokenRules, checked, framing_of
from modelhost.errors import is_item_error, item_error

WARM_UP = "modelhost warm-up"


@dataclass
class LlamaCppEmbedder(LlamaCppServer, BatchEngine):
    """The server in embedding mode, as a `BatchEngine` (`engines.interface`), and what checking an input
    needs of the model."""

    slots: int
    rules: TokenRules  # its framing is read from llama.cpp's tokenizer at warm-up
    gate: SlotGate = field(init=False)

    def __post_init__(self) -> None:
        self.gate = SlotGate(self.slots)

    async def run(self, item: dict[str, Any], low: bool, started: Callable[[], None]) -> dict[str, Any]:
        """One feature-extraction request (`_embed`)."""
        return await _embed(self, item, low, started)

    async def warm_up(self) -> None:
        """Read how llama.cpp's tokenizer frames a text (for the check of a client's token IDs), then
        embed one text through the same path as every request: a model llama.cpp loads but cannot run
        fails its load with llama.cpp's reason."""
        bare, framed = await asyncio.gather(_tokenize(self, "a", special=False), _tokenize(self, "a"))
        rules = self.rules
        self.rules = TokenRules(rules.max_tokens, rules.vocab_size, framing_of(bare, framed))
        output = await self.run({"inputs": [WARM_UP]}, False, lambda: None)
        if is_item_error(output):
            raise RuntimeError(output["error"]["message"])


def load_embedder(
    model_dir: Path, slots: int, context: int, threads: int | None, binary: str | None = None
) -> LlamaCppEmbedder:
    """llama.cpp's server in embedding mode over the artifact's GGUF: `slots` slots, each input at most
    `context` tokens."""
    path = gguf_file(model_dir)
    _, info = read_gguf_set(model_dir)
    embedding = Embedding(mean_pooling=not info.pooling_type)  # None or 0 (NONE): it names none
    server, client = start(path, slots, context, threads, binary, embedding)
    return LlamaCppEmbedder(server, client, slots, TokenRules(context, info.vocab_size or 0))


async def _embed(
    model: LlamaCppEmbedder, item: dict[str, Any], low: bool, started: Callable[[], None]
) -> dict[str, Any]:
    """One feature-extraction request (`tasks.feature_extraction`'s item and output): its vectors, or
    its `errors.item_error` for bad input (the caller's 400). `started` is called as it goes to llama.cpp; a
    failure of llama.cpp's raises."""
    inputs: list[str | list[int]] = item["inputs"]
    tokenized = await asyncio.gather(*(_tokenize(model, given) for given in inputs if isinstance(given, str)))
    texts = iter(tokenized)
    every = [given if isinstance(given, list) else next(texts) for given in inputs]
    ids = checked(model.rules, inputs, every)
    if isinstance(ids, dict):
        return ids
    async with model.gate.slot(low):
        started()
        response = await model.client.post("/v1/embeddings", json={"input": ids})
    if response.status_code == 400:  # llama.cpp's own checks of an input
        message = f"The engine refused the input: {error_message(response.text)}"
        return item_error(message, "input")
    if response.status_code != 200:
        raise RuntimeError(f"llama.cpp answered {response.status_code}: {error_message(response.text)}")
    data = sorted(response.json()["data"], key=lambda entry: int(entry["index"]))
    vectors = np.ascontiguousarray([entry["embedding"] for entry in data], dtype="<f4")
    return {
        "vectors": vectors.tobytes(),
        "count": len(ids),
        "dim": int(vectors.shape[1]),
        "tokens": sum(len(seq) for seq in ids),
    }


async def _tokenize(model: LlamaCppEmbedder, text: str, special: bool = True) -> list[int]:
    """A text's token IDs by the GGUF's own tokenizer, with the special tokens it adds (`special`)."""
    response = await model.client.post("/tokenize", json={"content": text, "add_special": special})
    if response.status_code != 200:
        why = error_message(response.text)
        raise RuntimeError(f"llama.cpp's tokenizer answered {response.status_code}: {why}")
    return [int(token) for token in response.json()["tokens"]]
