"""Reranking (`POST /v1/rerank`, `/v2/rerank`, `/rerank`): the request and answer that Cohere's and Jina's
clients, and the LangChain / LlamaIndex rerankers built on them, send and read (docs/tasks.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from modelhost.protocol.common import StrictModel

MAX_DOCUMENTS = 1000


class RerankDocument(StrictModel):
    """A document as an object (Cohere v1, Jina): only its text is read."""

    text: Annotated[str, Field(min_length=1)]


class RerankRequest(StrictModel):
    model: str | None = Field(
        default=None, description="Deployment model ID; optional with a key scoped to one deployment."
    )
    query: Annotated[str, Field(min_length=1, examples=["What is the capital of France?"])]
    documents: Annotated[
        list[Annotated[str, Field(min_length=1)] | RerankDocument],
        Field(min_length=1, max_length=MAX_DOCUMENTS),
    ] = Field(
        description="The texts to rank against the query: strings or `{text}` objects.",
        examples=[["Paris is the capital of France.", "Berlin is in Germany."]],
    )
    top_n: int | None = Field(
        default=None, ge=1, description="Answer only the best `top_n` (default: every document)."
    )
    return_documents: bool = Field(
        default=False, description="Give each result its document's text (`document: {text}`)."
    )
    max_tokens_per_doc: int | None = Field(
        default=None,
        ge=1,
        description="Cut each document to this many tokens before scoring (Cohere v2); the model's own "
        "limit applies anyway.",
    )
    rank_fields: list[str] | None = Field(
        default=None, description="Cohere v1: accepted for documents that are text; no other field is read."
    )
    return_text: bool | None = Field(default=None, description="Jina's name for `return_documents`.")
    max_chunks_per_doc: int | None = Field(
        default=None, ge=1, description="Cohere v1: accepted; a long document is cut, not split in chunks."
    )
    priority: int | None = Field(
        default=None, description="Cohere v2: accepted; requests are served in order."
    )


def _absent_if_none(value: object) -> bool:
    return value is None


class RerankResultDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int = Field(description="The document's position in the request.")
    relevance_score: float = Field(description="The model's score in [0, 1]: higher is more relevant.")
    document: RerankResultDocument | None = Field(
        default=None,
        exclude_if=_absent_if_none,
        description="Only with `return_documents` (or `return_text`): absent otherwise.",
    )


class RerankUsage(BaseModel):
    total_tokens: int
    prompt_tokens: int


class RerankBilledUnits(BaseModel):
    search_units: int


class RerankApiVersion(BaseModel):
    version: str


class RerankMeta(BaseModel):
    api_version: RerankApiVersion
    billed_units: RerankBilledUnits


class RerankResponse(BaseModel):
    """One answer for Cohere's and Jina's clients: Cohere's fields and Jina's `usage`."""

    id: str
    object: str = "rerank"
    model: str
    results: list[RerankResult] = Field(description="Best first.")
    usage: RerankUsage
    meta: RerankMeta
