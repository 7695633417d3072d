"""`POST /v1/embeddings` (OpenAI) and `POST /v1/feature-extraction` (api.md §4.12): one vector per input,
shaped by `serving.embeddings`."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from modelhost.api.deps import CallerPrincipal, deployment_for, run_inference
from modelhost.api.errors import error_responses
from modelhost.protocol.openai import CreateEmbeddingResponse, EmbeddingsRequest
from modelhost.protocol.tasks import FeatureExtractionRequest
from modelhost.serving.embeddings import as_inputs, embeddings_answer, encode, feature_vectors

router = APIRouter(responses=error_responses(400, 401, 402, 404, 413, 429, 502, 503, 504))

EMBEDDINGS_EXAMPLE = {
    "object": "list",
    "data": [{"object": "embedding", "index": 0, "embedding": [0.0123, -0.0456, 0.0789]}],
    "model": "minilm",
    "usage": {"prompt_tokens": 7, "total_tokens": 7},
}


@router.post(
    "/v1/embeddings",
    tags=["openai"],
    summary="Create embeddings (OpenAI-compatible)",
    response_model=CreateEmbeddingResponse,
    responses={200: {"content": {"application/json": {"example": EMBEDDINGS_EXAMPLE}}}},
)
async def create_embeddings(
    body: EmbeddingsRequest, request: Request, principal: CallerPrincipal
) -> Response:
    deployment = await deployment_for(request, principal, body.model, user=body.user)
    output = await run_inference(request, deployment.runtime_key, {"inputs": as_inputs(body.input)})
    return Response(encode(embeddings_answer(body, output)), media_type="application/json")


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
    return Response(feature_vectors(isinstance(body.inputs, str), output), media_type="application/json")
