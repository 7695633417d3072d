"""Reranking served on a text-ranking deployment (`POST /v1/rerank`, `/v2/rerank`, `/rerank`;
docs/tasks.md): the worker scores every document, `rerank_answer` sorts them, cuts to `top_n` and
attaches their text when asked, in the one answer shape Cohere's and Jina's clients read."""

from __future__ import annotations

import secrets
from typing import Any

from modelhost.protocol.rerank import (
    RerankApiVersion,
    RerankBilledUnits,
    RerankDocument,
    RerankMeta,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankResultDocument,
    RerankUsage,
)


def document_texts(body: RerankRequest) -> list[str]:
    """The documents' texts, strings or `{text}` objects alike."""
    return [d.text if isinstance(d, RerankDocument) else d for d in body.documents]


def rerank_item(body: RerankRequest) -> dict[str, Any]:
    """What the worker needs to score every document against the query."""
    return {
        "query": body.query,
        "documents": document_texts(body),
        "max_tokens_per_doc": body.max_tokens_per_doc,
    }


def rerank_answer(body: RerankRequest, model: str, output: dict[str, Any]) -> RerankResponse:
    """The documents best first (`top_n` of them), each with its text if `return_documents` (or Jina's
    `return_text`) asks."""
    texts = document_texts(body)
    scores: list[float] = output["scores"]
    order = sorted(range(len(texts)), key=lambda i: -scores[i])[: body.top_n]
    with_documents = body.return_documents or bool(body.return_text)
    results = [
        RerankResult(
            index=i,
            relevance_score=scores[i],
            document=RerankResultDocument(text=texts[i]) if with_documents else None,
        )
        for i in order
    ]
    return RerankResponse(
        id=f"rerank-{secrets.token_hex(8)}",
        model=model,
        results=results,
        usage=RerankUsage(total_tokens=output["tokens"], prompt_tokens=output["tokens"]),
        meta=RerankMeta(
            api_version=RerankApiVersion(version="2"), billed_units=RerankBilledUnits(search_units=1)
        ),
    )
