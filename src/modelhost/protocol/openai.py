"""OpenAI-compatible wire types of embeddings (chat, images, audio and videos have their own modules)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from modelhost.protocol.common import StrictModel

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
EmbeddingInput = (
    Annotated[str, Field(min_length=1)]
    | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=2048)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1, max_length=2048)]
)


class EmbeddingsRequest(StrictModel):
    model: str = Field(description="Your deployment's model ID.", examples=["minilm"])
    input: EmbeddingInput = Field(
        description="A string, an array of strings, an array of token IDs, or an array of token-ID arrays.",
        examples=["The food was delicious."],
    )
    encoding_format: Literal["float", "base64"] = Field(
        default="float", description="`base64`: little-endian float32 bytes, base64-encoded."
    )
    dimensions: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Keep the first N dimensions and re-normalise to unit length."
    )
    user: str | None = None


class Embedding(BaseModel):
    """One input's vector: floats, or `base64` of its little-endian float32 bytes."""

    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class CreateEmbeddingResponse(BaseModel):
    """The answer of `POST /v1/embeddings` (OpenAI's `CreateEmbeddingResponse`), as the OpenAPI document
    shows it. Built as plain dicts of the same shape (`serving.embeddings.EmbeddingsAnswer`), whose module
    docstring says why."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage
