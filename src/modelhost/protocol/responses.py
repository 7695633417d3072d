"""OpenAI Responses API wire types (`POST /v1/responses` and its stored responses; docs/responses.md).

Input items come back from clients as the SDK serialised earlier output (`status`, `annotations`,
`logprobs`, ids...): like chat messages they are read leniently, fields we do not use ignored, types
strict. The request itself refuses unknown fields, so a misspelt one is a 400 naming it; every field of
OpenAI's current request schema is listed, and what each does here is in docs/openai-compat.md.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag

from modelhost.protocol.chat import (
    MODEL_DEFAULT,
    Lenient,
    MinP,
    ReasoningEffort,
    RepetitionPenalty,
    StopTokenIds,
    StructuredOutputs,
    Temperature,
    TemplateKwargs,
    TopK,
)
from modelhost.protocol.common import SERVICE_TIER, ServiceTier, StrictModel


class TextPart(Lenient):
    """`input_text` in user and system messages, `output_text` in assistant messages sent back."""

    type: Literal["input_text", "output_text", "text"]
    text: str


class RefusalPart(Lenient):
    type: Literal["refusal"]
    refusal: str


class ImagePart(Lenient):
    """An image for a vision-language deployment (`image-text-to-text`); a text-only model refuses it."""

    type: Literal["input_image"]
    image_url: str | None = Field(default=None, description="An http(s) URL or a `data:` URI of the image.")
    file_id: str | None = Field(default=None, description="Not available here: send `image_url`.")
    detail: Literal["auto", "low", "high"] | None = Field(
        default=None, description="Accepted for OpenAI's clients; the model's processor sets the resolution."
    )


class MediaPart(Lenient):
    """Files and audio: refused on the models served here, with a 400 naming `input`."""

    type: Literal["input_file", "input_audio"]


ContentPart = Annotated[TextPart | RefusalPart | ImagePart | MediaPart, Field(discriminator="type")]


class MessageItem(Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCallItem(Lenient):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None


class FunctionCallOutputItem(Lenient):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]


class ReasoningText(Lenient):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(Lenient):
    """A reasoning model's earlier reasoning, sent back as the SDK keeps every output item: given to the
    chat template with the assistant turn that follows it (its `content`; a `summary` alone, as OpenAI's
    own models answer, is not the reasoning and is not rendered)."""

    type: Literal["reasoning"]
    id: str | None = None
    content: list[ReasoningText] | None = None
    summary: list[ReasoningText] = []


class McpApprovalResponseItem(Lenient):
    """The client's answer to an `mcp_approval_request` of the previous response: approved, the call is
    made before this response generates; denied, the model is told so."""

    type: Literal["mcp_approval_response"]
    approval_request_id: str
    approve: bool
    reason: str | None = None
    id: str | None = None


class McpOutputItem(Lenient):
    """An earlier response's `mcp_list_tools`, `mcp_call` or `mcp_approval_request` item, sent back as
    the SDK keeps every output item: kept as it is (a call is given to the model with its result)."""

    type: Literal["mcp_list_tools", "mcp_call", "mcp_approval_request"]
    id: str | None = None
    server_label: str
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    error: Any = None
    tools: list[dict[str, Any]] | None = None


class OtherItem(Lenient):
    """Other hosted tools' calls, item references and the like: a 400 naming `input` (see
    docs/responses.md)."""

    type: str


_MCP_ITEMS = ("mcp_list_tools", "mcp_call", "mcp_approval_request")


def _item_kind(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    if kind in _MCP_ITEMS:
        return "mcp"
    return kind if kind in _KNOWN_ITEMS else "other"


_KNOWN_ITEMS = ("message", "function_call", "function_call_output", "reasoning", "mcp_approval_response")
InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[McpApprovalResponseItem, Tag("mcp_approval_response")]
    | Annotated[McpOutputItem, Tag("mcp")]
    | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_kind),
]


class FunctionTool(StrictModel):
    type: Literal["function"]
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="JSON Schema of the arguments.")
    strict: bool | None = None


class McpToolFilter(StrictModel):
    tool_names: list[str] | None = None
    read_only: bool | None = Field(default=None, description="Not available here: a 400 naming it.")


class McpApprovalFilter(StrictModel):
    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


class McpTool(StrictModel):
    """A hosted MCP server (docs/responses.md, "MCP tools"): its URL must be on the account's allow-list
    of MCP servers; its tools are offered to the model by their own names and called by this server."""

    type: Literal["mcp"]
    server_label: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    server_url: str | None = Field(default=None, description="The server's streamable-HTTP endpoint.")
    server_description: str | None = None
    allowed_tools: list[str] | McpToolFilter | None = Field(
        default=None, description="Only these of the server's tools are offered (default: all)."
    )
    require_approval: Literal["always", "never"] | McpApprovalFilter | None = Field(
        default=None, description='"always" (the default, as OpenAI\'s), "never", or per tool.'
    )
    headers: dict[str, str] | None = Field(
        default=None, description="Sent to this server only, with each MCP request; never stored or echoed."
    )
    authorization: str | None = Field(
        default=None, description="An OAuth access token: sent as `Authorization: Bearer ...`."
    )
    connector_id: str | None = Field(default=None, description="OpenAI's connectors: not available here.")
    defer_loading: bool | None = None
    allowed_callers: list[str] | None = None
    tunnel_id: str | None = Field(default=None, description="Not available here.")


class HostedTool(Lenient):
    """OpenAI's other hosted tools (web search, file search, code interpreter...): a 400 naming `tools`."""

    type: str


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ("function", "mcp") else "hosted"


ToolParam = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[McpTool, Tag("mcp")]
    | Annotated[HostedTool, Tag("hosted")],
    Discriminator(_tool_kind),
]


class FunctionToolChoice(StrictModel):
    type: Literal["function"]
    name: str


class OtherToolChoice(Lenient):
    """`allowed_tools`, hosted tools, MCP, custom: a 400 naming `tool_choice`."""

    type: str


class TextFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")] | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(StrictModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class StreamOptions(StrictModel):
    include_obfuscation: bool | None = None


class Reasoning(StrictModel):
    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = Field(
        default=None,
        description="Accepted without effect: the reasoning is answered whole, never summarised.",
    )
    generate_summary: Literal["auto", "concise", "detailed"] | None = Field(
        default=None, description="Deprecated form of `summary`."
    )


Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]], Field(max_length=16)
]


class ResponseCreateRequest(StrictModel):
    model: str = Field(description="Your deployment's model ID.", examples=["chat"])
    input: Annotated[str, Field(min_length=1)] | Annotated[list[InputItem], Field(min_length=1)] = Field(
        description="A user message as text, or items: messages, `function_call`s and their "
        "`function_call_output`s.",
        examples=["Say hello."],
    )
    instructions: str | None = Field(default=None, description="A system message for this response only.")
    tools: Annotated[list[ToolParam], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | OtherToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Temperature | None = Field(default=None, description=MODEL_DEFAULT + ", else 1.")
    top_p: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None, description=MODEL_DEFAULT + ", else 1."
    )
    top_k: TopK | None = Field(default=None, description="Extension (as chat's)." + MODEL_DEFAULT + ".")
    min_p: MinP | None = Field(default=None, description="Extension (as chat's)." + MODEL_DEFAULT + ".")
    repetition_penalty: RepetitionPenalty | None = Field(
        default=None, description="Extension (as chat's)." + MODEL_DEFAULT + "."
    )
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Extension (as chat's): no end-of-sequence before this many tokens."
    )
    stop_token_ids: StopTokenIds | None = Field(default=None, description="Extension (as chat's).")
    ignore_eos: bool | None = Field(default=None, description="Extension (as chat's).")
    include_stop_str_in_output: bool | None = Field(default=None, description="Extension (as chat's).")
    skip_special_tokens: bool | None = Field(default=None, description="Extension (as chat's).")
    chat_template_kwargs: TemplateKwargs | None = Field(
        default=None, description="Extension (as chat's, and vLLM's Responses API): template variables."
    )
    structured_outputs: StructuredOutputs | None = Field(
        default=None,
        description="Extension (as chat's, and vLLM's Responses API). Not with `text.format` JSON.",
    )
    include: list[str] | None = None
    metadata: Metadata | None = None
    store: bool | None = Field(default=None, description="Keep the response (default true).")
    previous_response_id: str | None = Field(
        default=None, description="Continue from a stored response: its input and output come first."
    )
    background: bool | None = Field(
        default=None, description="Answer at once (`queued`) and generate in the background."
    )
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    reasoning: Reasoning | None = Field(
        default=None, description="`effort`: as chat's `reasoning_effort` (a model without a switch → 400)."
    )
    service_tier: ServiceTier | None = Field(default=None, description=SERVICE_TIER)
    cache_salt: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        default=None, description="Extension (as vLLM): as chat's `cache_salt`."
    )
    # Accepted without effect (docs/openai-compat.md says why each is safe to ignore).
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    max_tool_calls: Annotated[int, Field(ge=1)] | None = None
    background_options: dict[str, Any] | None = None
    context_management: list[dict[str, Any]] | None = None
    moderation: dict[str, Any] | None = None
    access_programs: dict[str, Any] | None = None
    image: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = Field(
        default=None,
        description="A conversation's ID (or `{id}`): its items come first, and this turn's input and "
        "output are appended to it. Not with `previous_response_id`.",
    )
    # Refused when set (it needs OpenAI-side objects we do not have): a 400 naming the field.
    prompt: dict[str, Any] | None = None


# ---------------------------------------------------------------- answers (documentation of the shapes)


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[dict[str, Any]] | None = None


class ReasoningOutput(BaseModel):
    """A reasoning model's reasoning (OpenAI's open-weight form, as vLLM answers it): its text whole in
    `content`, no summary."""

    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[Any] = []
    content: list[dict[str, str]]
    status: Literal["in_progress", "completed", "incomplete"]


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class FunctionCallOutput(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class McpListToolsOutput(BaseModel):
    id: str
    type: Literal["mcp_list_tools"] = "mcp_list_tools"
    server_label: str
    tools: list[dict[str, Any]] = Field(description="`name`, `description`, `input_schema`, `annotations`.")


class McpCallOutput(BaseModel):
    id: str
    type: Literal["mcp_call"] = "mcp_call"
    server_label: str
    name: str
    arguments: str
    output: str | None = None
    error: dict[str, Any] | None = Field(
        default=None,
        description="`mcp_tool_execution_error` (`content`) or `mcp_protocol_error` (`message`).",
    )
    status: Literal["in_progress", "completed", "failed"]
    approval_request_id: str | None = None


class McpApprovalRequestOutput(BaseModel):
    id: str
    type: Literal["mcp_approval_request"] = "mcp_approval_request"
    server_label: str
    name: str
    arguments: str


class InputTokensDetails(BaseModel):
    cached_tokens: int
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: str


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    model: str
    output: list[
        ReasoningOutput
        | OutputMessage
        | FunctionCallOutput
        | McpListToolsOutput
        | McpCallOutput
        | McpApprovalRequestOutput
    ]
    usage: ResponseUsage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    store: bool | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] = []
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = {}
    reasoning: dict[str, Any] | None = None
    conversation: dict[str, str] | None = Field(
        default=None, description="`{id}` of the conversation this turn was appended to."
    )


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: Literal[True] = True


class InputItemList(BaseModel):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool
