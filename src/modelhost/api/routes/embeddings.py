"""`POST /v1/embeddings` (OpenAI) and `POST /v1/feature-extraction` (api.md §4.12): one vector per input."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Request, Response

from modelhost.api.deps import CallerPrincipal, deployment_for, run_inference
from modelhost.api.errors import error_responses
from modelhost.protocol.openai import EmbeddingsRequest, EmbeddingsResponse
from modelhost.protocol.tasks import FeatureExtractionRequest

router = APIRouter(responses=error_responses(400, 401, 402, 404, 413, 429, 502, 503, 504))

EMBEDDINGS_EXAMPLE = {
    "object": "list",
    "data": [{"object": "embedding", "index": 0, "embedding": [0.0123, -0.0456, 0.0789]}],
    "model": "minilm",
    "usage": {"prompt_tokens": 7, "total_tokens": 7},
}


def as_inputs(value: str | list[Any]) -> list[str | list[int]]:
    """OpenAI's four input shapes → a list of inputs (strings or token-ID lists)."""
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        return [value]
    return list(value)


def vectors_of(output: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(output["vectors"], dtype="<f4").reshape(output["count"], output["dim"])


def truncate(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Keep the first `dimensions` components and re-normalise each vector to unit length."""
    if dimensions is None or dimensions >= vectors.shape[1]:
        return vectors
    cut = vectors[:, :dimensions]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return np.ascontiguousarray(cut / np.maximum(norms, 1e-12), dtype="<f4")


@router.post(
    "/v1/embeddings",
    tags=["openai"],
    summary="Create embeddings (OpenAI-compatible)",
    response_model=EmbeddingsResponse,
    responses={200: {"content": {"application/json": {"example": EMBEDDINGS_EXAMPLE}}}},
)
async def create_embeddings(
    body: EmbeddingsRequest, request: Request, principal: CallerPrincipal
) -> Response:
    deployment = await deployment_for(request, principal, body.model, user=body.user)
    output = await run_inference(request, deployment.runtime_key, {"inputs": as_inputs(body.input)})
    vectors = truncate(vectors_of(output), body.dimensions)
    if body.encoding_format == "base64":
        encoded: list[Any] = [base64.b64encode(row.tobytes()).decode("ascii") for row in vectors]
    else:
        encoded = list(vectors)  # float32 rows, written by orjson as each float32's shortest form
    payload = {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(encoded)],
        "model": body.model,
        "usage": {"prompt_tokens": output["tokens"], "total_tokens": output["tokens"]},
    }
    return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")


@router.post(
    "/v1/feature-extraction",
    tags=["tasks"],
    summary="Feature extraction: a vector for a string, a list of vectors for a list of strings",
    response_model=list[float] | list[list[float]],
    responses={200: {"content": {"application/json": {"example": [0.0123, -0.0456, 0.0789]}}}},
)
async def feature_extraction(
    body: FeatureExtractionRequest, request: Request, principal: CallerPrincipal
) -> Response:
    deployment = await deployment_for(request, principal, body.model)
    inputs = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    output = await run_inference(request, deployment.runtime_key, {"inputs": inputs})
    vectors = vectors_of(output)
    return Response(
        orjson.dumps(
            vectors[0] if isinstance(body.inputs, str) else vectors, option=orjson.OPT_SERIALIZE_NUMPY
        ),
        media_type="application/json",
    )
