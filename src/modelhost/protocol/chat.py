"""OpenAI-compatible text generation wire types: chat completions and completions (api.md §4.16, §6)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from modelhost.protocol.common import StrictModel

Stop = (
    Annotated[str, Field(min_length=1)]
    | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=16)]
)
Temperature = Annotated[float, Field(ge=0, le=2)]
Penalty = Annotated[float, Field(ge=-2, le=2)]


class Lenient(BaseModel):
    """Messages a client sends back as the SDK serialised them (`refusal: null`, `annotations`...): fields
    we do not use are ignored rather than refused; types stay strict."""

    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(Lenient):
    type: Literal["text"]
    text: str


class FunctionCall(Lenient):
    name: str
    arguments: str = Field(description="JSON text of the arguments object.")


class ToolCallIn(Lenient):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_or_calls(self) -> Message:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (null only for an assistant message with tool_calls)")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        return self


class FunctionDefinition(StrictModel):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="JSON Schema of the arguments.")
    strict: bool | None = None


class Tool(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(StrictModel):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type json_schema, and only then")
        return self


class StreamOptions(StrictModel):
    include_usage: bool | None = None


class SamplingFields(StrictModel):
    """What chat completions and completions share."""

    model: str = Field(description="Your deployment's model ID.", examples=["chat"])
    temperature: Temperature | None = Field(default=None, description="0 = greedy. Default 1.")
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1, le=16)] | None = None
    stop: Stop | None = Field(default=None, description="Generation stops before any of these strings.")
    seed: int | None = Field(default=None, description="Same seed and parameters → same output.")
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Extension (as vLLM): no end-of-sequence before this many tokens."
    )


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: Annotated[list[Tool], Field(min_length=1, max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(SamplingFields):
    prompt: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=64)]
        | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
        | Annotated[
            list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]],
            Field(min_length=1, max_length=64),
        ]
    )
    max_tokens: Annotated[int, Field(ge=1)] | None = Field(default=16, description="Default 16, as OpenAI.")
    echo: bool | None = None
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None


# ---------------------------------------------------------------- responses (documentation of the shapes)


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens taken from the replica's KV cache (a prefix computed before)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: Literal["stop", "length", "tool_calls"]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: Literal["stop", "length"]


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str | None = None
