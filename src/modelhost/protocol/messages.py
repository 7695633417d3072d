"""Anthropic Messages API wire types (`POST /v1/messages`, `POST /v1/messages/count_tokens`;
docs/messages.md).

The request is checked as Anthropic checks it (unknown top-level fields refused, `max_tokens` required on
`/v1/messages`); content blocks a client sends back are read leniently (their `cache_control`,
`citations`, `signature`... are ignored), and block types no model here can read are refused by name.
The serving (`serving.messages`) turns a checked request into a chat completion request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from modelhost.protocol.common import StrictModel

NO_EFFECT = "Accepted for Anthropic compatibility; no effect here (docs/messages.md)."
BLOCK_TYPES = (
    "text",
    "image",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
    "mcp_tool_use",
    "mcp_tool_result",
)


class Block(BaseModel):
    """A content block as a client sends it (back): fields we do not use are ignored; types stay strict."""

    model_config = ConfigDict(extra="ignore", strict=True)


class TextBlock(Block):
    type: Literal["text"]
    text: str


class Base64Source(Block):
    type: Literal["base64"]
    media_type: str = Field(description="The image's type, e.g. `image/png`.")
    data: str = Field(min_length=1)


class URLSource(Block):
    type: Literal["url"]
    url: str = Field(min_length=1, description="An http(s) URL, under the media rules (docs/media.md).")


class ImageBlock(Block):
    """An image for a vision-language deployment (`image-text-to-text`); a text-only model refuses it."""

    type: Literal["image"]
    source: Annotated[Base64Source | URLSource, Field(discriminator="type")]


class ToolUseBlock(Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


def _result_blocks(value: Any) -> Any:
    """A tool result holds text and images only."""
    if isinstance(value, list):
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind not in ("text", "image"):
                raise ValueError(
                    f"tool_result content blocks of type {kind!r} are not supported: send text or image"
                )
    return value


class ToolResultBlock(Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: Annotated[str | list[TextBlock | ImageBlock], BeforeValidator(_result_blocks)] | None = None
    is_error: bool | None = Field(
        default=None, description="Rendered as the result's text, prefixed `Error: `."
    )


class ThinkingBlock(Block):
    """An earlier answer's reasoning, sent back: given to the chat template as the assistant turn's
    `reasoning_content` (templates that drop earlier reasoning drop it)."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class McpToolUseBlock(Block):
    """A call this server made to an MCP tool (the MCP connector), sent back in an assistant turn."""

    type: Literal["mcp_tool_use"]
    id: str
    name: str
    server_name: str
    input: dict[str, Any]


class McpToolResultBlock(Block):
    """That call's result, in the same assistant turn."""

    type: Literal["mcp_tool_result"]
    tool_use_id: str
    is_error: bool | None = None
    content: str | list[TextBlock] | None = None


class RedactedThinkingBlock(Block):
    """Encrypted reasoning (Anthropic's own models): nothing a model here can read; dropped."""

    type: Literal["redacted_thinking"]
    data: str


def _known_blocks(value: Any) -> Any:
    """A clear refusal for block types no deployment here reads (documents, search results, server tool
    blocks): dropping them would answer a question nobody asked."""
    if isinstance(value, list):
        for block in value:
            kind = block.get("type") if isinstance(block, dict) else None
            if isinstance(kind, str) and kind not in BLOCK_TYPES:
                raise ValueError(
                    f"content blocks of type {kind!r} are not supported: chat deployments read "
                    f"{', '.join(BLOCK_TYPES)} blocks (docs/messages.md)"
                )
    return value


ContentBlock = Annotated[
    TextBlock
    | ImageBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | McpToolUseBlock
    | McpToolResultBlock,
    Field(discriminator="type"),
]


class McpToolConfiguration(StrictModel):
    enabled: bool | None = Field(default=None, description="false: the server's tools are not offered.")
    allowed_tools: list[str] | None = Field(default=None, description="Only these tools are offered.")


class McpServerDefinition(StrictModel):
    """An MCP server for the MCP connector (beta `mcp-client-2025-04-04`; docs/messages.md): its URL must
    be on the account's allow-list of MCP servers."""

    type: Literal["url"]
    url: str
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    authorization_token: str | None = Field(
        default=None, description="Sent to this server only as `Authorization: Bearer ...`; never stored."
    )
    tool_configuration: McpToolConfiguration | None = None


class MessageParam(Block):
    role: Literal["user", "assistant"]
    content: Annotated[str | list[ContentBlock], BeforeValidator(_known_blocks)]


class SystemBlock(Block):
    type: Literal["text"]
    text: str


class ToolDefinition(Block):
    """A client tool (`type` absent or `custom`). Anthropic's server tools (`web_search_...`,
    `bash_...`, `text_editor_...`) need Anthropic's own runtime: refused by name (docs/messages.md)."""

    type: str | None = None
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    input_schema: dict[str, Any] | None = Field(default=None, description="JSON Schema of the input object.")


class ToolChoice(StrictModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(default=None, description="The tool to call (`type: tool`).")
    disable_parallel_tool_use: bool | None = Field(default=None, description="At most one tool call.")


class ThinkingConfig(StrictModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="On gpt-oss, chooses its effort level (below 4096: low, below 16384: medium, else high); "
        "elsewhere thinking is on or off (docs/messages.md).",
    )
    display: Literal["summarized", "omitted"] | None = Field(default=None, description=NO_EFFECT)


class MetadataParam(StrictModel):
    user_id: str | None = Field(
        default=None,
        max_length=256,
        description="Keeps the caller on one version of a canary sticky by user (docs/deploy.md), as chat's "
        "`user`; no other effect.",
    )


class OutputFormat(StrictModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(StrictModel):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        default=None, description="The reasoning effort, as `thinking` maps it onto the family's switch."
    )
    format: OutputFormat | None = Field(default=None, description="The answer is JSON valid against it.")


class CountTokensRequest(StrictModel):
    """`POST /v1/messages/count_tokens`: the fields that shape the prompt."""

    model: str = Field(description="Your deployment's model ID.", examples=["chat"])
    messages: Annotated[list[MessageParam], Field(min_length=1)]
    system: str | list[SystemBlock] | None = None
    tools: Annotated[list[ToolDefinition], Field(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    cache_control: dict[str, Any] | None = Field(default=None, description=NO_EFFECT)
    context_management: dict[str, Any] | None = Field(default=None, description=NO_EFFECT)
    mcp_servers: Annotated[list[McpServerDefinition], Field(max_length=20)] | None = Field(
        default=None, description="The MCP connector: servers whose tools this server calls (not counted)."
    )


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`."""

    max_tokens: Annotated[int, Field(ge=1)] = Field(description="Required, as Anthropic requires it.")
    stop_sequences: Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=16)] | None = None
    stream: bool | None = None
    temperature: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None, description="Unset: the model's default (docs/generation.md)."
    )
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    metadata: MetadataParam | None = None
    service_tier: Literal["auto", "standard_only"] | None = Field(
        default=None, description="Either runs in the default tier; `usage.service_tier`: standard."
    )
    speed: str | None = Field(default=None, description=NO_EFFECT)
    inference_geo: str | None = Field(default=None, description=NO_EFFECT)
    diagnostics: dict[str, Any] | None = Field(default=None, description=NO_EFFECT)
    container: Any = Field(default=None, description="Refused (400): no code-execution container here.")
    user_profile_id: str | None = Field(default=None, description=NO_EFFECT)
    workspace_id: str | None = Field(default=None, description=NO_EFFECT)


# ---------------------------------------------------------------- answers (documentation of the wire)


class Usage(BaseModel):
    input_tokens: int = Field(description="Prompt tokens not read from the prefix cache.")
    output_tokens: int
    cache_read_input_tokens: int = Field(description="Prompt tokens read from the engine's prefix cache.")
    cache_creation_input_tokens: int = Field(description="Always 0: the prefix cache fills by itself.")


class Message(BaseModel):
    id: str = Field(examples=["msg_4f1c0e2a9b7d5c3e1a0f8b6d"])
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]] = Field(description="`thinking`, then `text`, then `tool_use` blocks.")
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
    stop_sequence: str | None
    usage: Usage


class TokenCount(BaseModel):
    input_tokens: int


class AnthropicErrorDetail(BaseModel):
    type: str = Field(description="`invalid_request_error`, `authentication_error`, `not_found_error`...")
    message: str


class AnthropicError(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
