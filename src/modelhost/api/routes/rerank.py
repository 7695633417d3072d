"""Reranking (issue 19): `POST /v1/rerank`, `/v2/rerank` and `/rerank` on a text-ranking deployment.

One answer shape for the clients people rerank with: Cohere's (`results[].index`, `relevance_score`,
`document`, `meta.billed_units`), Jina's (`usage.total_tokens`, `return_text`), and the LangChain and
LlamaIndex rerankers built on them. The worker scores every document; `serving.rerank` sorts, cuts to
`top_n` and attaches the documents when asked. Decisions: docs/tasks.md.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from modelhost.api.answers import json_answer
from modelhost.api.deps import CallerPrincipal, ServicesDep, deployment_for, run_inference
from modelhost.api.errors import error_responses
from modelhost.protocol.rerank import RerankRequest, RerankResponse
from modelhost.serving.rerank import rerank_answer, rerank_item

router = APIRouter(tags=["tasks"], responses=error_responses(400, 401, 402, 404, 413, 429, 502, 503, 504))

EXAMPLE_REQUEST = {
    "model": "reranker",
    "query": "What is the capital of France?",
    "documents": ["Berlin is in Germany.", "Paris is the capital of France."],
    "top_n": 1,
    "return_documents": True,
}
EXAMPLE_ANSWER = {
    "id": "rerank-3f9c0a1b2c3d4e5f",
    "object": "rerank",
    "model": "reranker",
    "results": [
        {"index": 1, "relevance_score": 0.97, "document": {"text": "Paris is the capital of France."}}
    ],
    "usage": {"total_tokens": 31, "prompt_tokens": 31},
    "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
}


async def rerank(
    body: RerankRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    deployment = await deployment_for(request, principal, body.model)
    output = await run_inference(request, deployment.runtime_key, rerank_item(body))
    return json_answer(rerank_answer(body, deployment.model, output))


for _path in ("/v1/rerank", "/v2/rerank", "/rerank"):
    router.add_api_route(
        _path,
        rerank,
        methods=["POST"],
        name=f"rerank{_path.replace('/', '_')}",
        summary="Rerank documents by their relevance to a query (Cohere- and Jina-compatible)",
        response_model=RerankResponse,
        openapi_extra={"requestBody": {"content": {"application/json": {"example": EXAMPLE_REQUEST}}}},
        responses={200: {"content": {"application/json": {"example": EXAMPLE_ANSWER}}}},
    )
