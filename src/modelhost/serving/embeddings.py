"""OpenAI embeddings and feature extraction served on an encoder deployment (`POST /v1/embeddings`,
`POST /v1/feature-extraction`; api.md §4.12).

The worker answers every input's vector as one float32 buffer; `embeddings_answer` cuts it to
`dimensions` and shapes OpenAI's `CreateEmbeddingResponse`, which `encode` writes.

Embeddings are the hot path (thousands of vectors of hundreds of floats in one answer, or one short
sentence per request at a few hundred requests a second), so the answer is typed (`EmbeddingsAnswer`,
the shape of `protocol.openai.CreateEmbeddingResponse`, which the OpenAPI document shows) but not
validated or built as pydantic models: the float32 rows stay as they are (numpy arrays, no per-float
Python objects), and orjson writes them straight from numpy, each float32 in its shortest form.
Validating the answer would turn every float into a Python float (and write float32 values with
double-precision noise, `0.10000000149011612`): a cost per float, for an answer made here. Building it
as pydantic models unvalidated (`model_construct`) cost 40 µs a request more than these dicts (issue 71).
"""

from __future__ import annotations

import base64
from typing import Any, Literal, TypedDict

import numpy as np
import orjson

from modelhost.protocol.openai import EmbeddingsRequest


class EmbeddingAnswer(TypedDict):
    """One input's vector (`protocol.openai.Embedding`): float32 row, or base64 of its bytes."""

    object: Literal["embedding"]
    index: int
    embedding: np.ndarray | str


class EmbeddingsUsageAnswer(TypedDict):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsAnswer(TypedDict):
    """`POST /v1/embeddings`' answer, its fields in `protocol.openai.CreateEmbeddingResponse`'s order."""

    object: Literal["list"]
    data: list[EmbeddingAnswer]
    model: str
    usage: EmbeddingsUsageAnswer


def as_inputs(value: str | list[Any]) -> list[str | list[int]]:
    """OpenAI's four input shapes → a list of inputs (strings or token-ID lists)."""
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        return [value]
    return list(value)


def vectors_of(output: dict[str, Any]) -> np.ndarray:
    """The worker's vectors, one row per input (a view of its buffer, not a copy)."""
    return np.frombuffer(output["vectors"], dtype="<f4").reshape(output["count"], output["dim"])


def truncate(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Keep the first `dimensions` components and re-normalise each vector to unit length."""
    if dimensions is None or dimensions >= vectors.shape[1]:
        return vectors
    cut = vectors[:, :dimensions]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return np.ascontiguousarray(cut / np.maximum(norms, 1e-12), dtype="<f4")


def embeddings_answer(body: EmbeddingsRequest, output: dict[str, Any]) -> EmbeddingsAnswer:
    """OpenAI's answer: one `Embedding` per input, in order; float32 rows, or base64 of their bytes."""
    vectors = truncate(vectors_of(output), body.dimensions)
    if body.encoding_format == "base64":
        encoded: list[Any] = [base64.b64encode(row.tobytes()).decode("ascii") for row in vectors]
    else:
        encoded = list(vectors)  # float32 rows, written by `encode` as each float32's shortest form
    tokens = output["tokens"]
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(encoded)],
        "model": body.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def encode(answer: EmbeddingsAnswer) -> bytes:
    """The answer's JSON, numpy rows written by orjson."""
    return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)


def feature_vectors(single: bool, output: dict[str, Any]) -> bytes:
    """`/v1/feature-extraction`'s answer (a bare vector for one string, a list for a list): JSON arrays
    written from numpy, as `encode` writes embeddings."""
    vectors = vectors_of(output)
    return orjson.dumps(vectors[0] if single else vectors, option=orjson.OPT_SERIALIZE_NUMPY)
