"""Reranking (issue 19): `POST /v1/rerank`, `/v2/rerank` and `/rerank` on a text-ranking deployment.

One answer shape for the clients people rerank with: Cohere's (`results[].index`, `relevance_score`,
`document`, `meta.billed_units`), Jina's (`usage.total_tokens`, `return_text`), and the LangChain and
LlamaIndex rerankers built on them. The worker scores every document; this route sorts, cuts to
`top_n` and attaches the documents when asked. Decisions: docs/tasks.md.
"""

from __future__ import annotations

import secrets

import orjson
from fastapi import APIRouter, Request, Response

from modelhost.api.deps import CallerPrincipal, ServicesDep, deployment_for, run_inference
from modelhost.api.errors import error_responses
from modelhost.protocol.rerank import RerankDocument, RerankRequest, RerankResponse

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
    texts = [d.text if isinstance(d, RerankDocument) else d for d in body.documents]
    item = {"query": body.query, "documents": texts, "max_tokens_per_doc": body.max_tokens_per_doc}
    output = await run_inference(request, deployment.runtime_key, item)
    scores: list[float] = output["scores"]
    order = sorted(range(len(texts)), key=lambda i: -scores[i])[: body.top_n]
    with_documents = body.return_documents or bool(body.return_text)
    results = [
        {
            "index": i,
            "relevance_score": scores[i],
            **({"document": {"text": texts[i]}} if with_documents else {}),
        }
        for i in order
    ]
    answer = {
        "id": f"rerank-{secrets.token_hex(8)}",
        "object": "rerank",
        "model": deployment.model,
        "results": results,
        "usage": {"total_tokens": output["tokens"], "prompt_tokens": output["tokens"]},
        "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
    }
    return Response(orjson.dumps(answer), media_type="application/json")


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
