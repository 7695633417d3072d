"""OpenAI-compatible text generation wire types: chat completions and completions (api.md §4.16, §6)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from modelhost.protocol.common import (
    NO_EFFECT,
    PRIORITY_BOUND,
    PRIORITY_FIELD,
    SERVICE_TIER,
    Metadata,
    ServiceTier,
    StrictModel,
)

Stop = (
    Annotated[str, Field(min_length=1)]
    | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=16)]
)
Temperature = Annotated[float, Field(ge=0, le=2)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
TopK = Annotated[int, Field(ge=-1)]
MinP = Annotated[float, Field(ge=0, le=1)]
RepetitionPenalty = Annotated[float, Field(gt=0, allow_inf_nan=False)]
StopTokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=64)]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]  # OpenAI's values
MODEL_DEFAULT = " Unset: the model's default (its generation_config.json, docs/generation.md)"
GUIDED = "Deprecated: vLLM's older name (0.32 ignores it; here it still constrains) of `structured_outputs."
MAX_LOGIT_BIAS = 1024  # entries; OpenAI documents none, vLLM none either
MAX_BEST_OF = 20  # OpenAI's own limit
MAX_TEMPLATE_KWARGS = 16_384  # characters of `chat_template_kwargs` as JSON: a few switches, not a document
# Variables the chat template already gets from us or from transformers' `apply_chat_template` (its own
# arguments, the special tokens, the Jinja helpers): `chat_template_kwargs` may not replace them.
TEMPLATE_VARIABLES = frozenset(
    {
        "messages", "conversation", "tools", "documents", "add_generation_prompt",
        "continue_final_message", "chat_template", "tokenize", "padding", "truncation", "max_length",
        "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
        "processor_kwargs", "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
        "mask_token", "additional_special_tokens", "raise_exception", "strftime_now",
    }
)  # fmt: skip


def _check_logit_bias(value: dict[str, float]) -> dict[str, float]:
    """Token IDs as decimal strings, biases in [-100, 100]; whether each ID is in the model's vocabulary
    is checked by the worker, which knows it."""
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 9):
            raise ValueError(f'keys are token IDs written as decimal strings (like "50256"), not {key!r}')
        if not -100 <= bias <= 100:
            raise ValueError(f"biases are between -100 and 100 (token {key}: {bias})")
    return value


def _check_template_kwargs(value: dict[str, Any]) -> dict[str, Any]:
    """JSON values of bounded size, under names that are not the template's own variables."""
    clashes = sorted(TEMPLATE_VARIABLES.intersection(value))
    if clashes:
        raise ValueError(f"{', '.join(clashes)}: the chat template's own variables, not yours to set")
    if len(json.dumps(value)) > MAX_TEMPLATE_KWARGS:
        raise ValueError(f"at most {MAX_TEMPLATE_KWARGS} characters as JSON")
    return value


TemplateKwargs = Annotated[dict[str, Any], AfterValidator(_check_template_kwargs)]


LogitBias = Annotated[
    dict[str, float],
    Field(
        max_length=MAX_LOGIT_BIAS,
        description="Token ID (decimal string) → bias in [-100, 100] added to the token's logit before "
        "sampling (greedy too): -100 bans a token, 100 all but forces it. IDs outside the model's "
        "vocabulary → 400.",
        examples=[{"50256": -100}],
    ),
    AfterValidator(_check_logit_bias),
]


class Lenient(BaseModel):
    """Messages a client sends back as the SDK serialised them (`refusal: null`, `annotations`...): fields
    we do not use are ignored rather than refused; types stay strict."""

    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(Lenient):
    type: Literal["text"]
    text: str


class RefusalPart(Lenient):
    """What an assistant message of an earlier answer may hold; rendered as its text."""

    type: Literal["refusal"]
    refusal: str


class ImageURL(Lenient):
    url: str = Field(min_length=1, description="An http(s) URL or a `data:` URI of the image.")
    detail: Literal["auto", "low", "high"] | None = Field(
        default=None, description="Accepted for OpenAI's clients; the model's processor sets the resolution."
    )


class ImageURLPart(Lenient):
    """An image for a vision-language deployment (`image-text-to-text`); a text-only model refuses it."""

    type: Literal["image_url"]
    image_url: ImageURL


def _known_parts_only(value: Any) -> Any:
    """A clear refusal for audio and file parts (no model here reads them, and dropping them would
    answer a question nobody asked)."""
    if isinstance(value, list):
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind not in ("text", "refusal", "image_url"):
                raise ValueError(
                    f"content parts of type {kind!r} are not supported: chat deployments read `text` "
                    "parts, `image_url` parts (vision-language models) and `refusal` parts of earlier answers"
                )
    return value


Content = Annotated[str | list[TextPart | RefusalPart | ImageURLPart], BeforeValidator(_known_parts_only)]


class FunctionCall(Lenient):
    name: str
    arguments: str = Field(description="JSON text of the arguments object.")


class ToolCallIn(Lenient):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Lenient):
    """`function` (a result of a legacy `function_call`) and an assistant's `function_call` are the
    deprecated forms of `tool` and `tool_calls`, rendered as those."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    function_call: FunctionCall | None = None
    reasoning_content: str | None = Field(
        default=None,
        description="An assistant's earlier reasoning, as answered: given to the chat template (Qwen3's "
        "and GLM's read `reasoning_content`, gpt-oss's `thinking`); templates that drop it drop it.",
    )
    reasoning: str | None = Field(default=None, description="The same, under vLLM's newer name.")

    @model_validator(mode="after")
    def _content_or_calls(self) -> Message:
        calls = self.tool_calls or self.function_call
        if self.content is None and not (self.role == "assistant" and calls):
            raise ValueError(
                "content is required (null only for an assistant message with tool_calls or function_call)"
            )
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.role == "function" and not self.name:
            raise ValueError("a function message needs the name of the function it answers")
        return self


class FunctionDefinition(StrictModel):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="JSON Schema of the arguments.")
    strict: bool | None = None


def _function_tools_only(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") == "custom":
        raise ValueError(
            "custom tools (free-form text input) are not supported: declare a function tool with a JSON "
            "Schema `parameters` instead"
        )
    return value


class Tool(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


class AllowedTools(StrictModel):
    mode: Literal["auto", "required"]
    tools: Annotated[list[NamedToolChoice], Field(min_length=1, max_length=128)] = Field(
        description='`{"type": "function", "function": {"name"}}` entries naming tools of `tools`.'
    )


class AllowedToolsChoice(StrictModel):
    """Only these tools, called as `mode` says (`auto` or `required`); the others are not rendered."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ToolChoice = Annotated[
    Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice,
    BeforeValidator(_function_tools_only),
]


class ChatAudio(StrictModel):
    format: str
    voice: str | dict[str, Any]


class Prediction(StrictModel):
    type: Literal["content"]
    content: str | list[TextPart]


def _text_only(value: list[str] | None) -> list[str] | None:
    if value is not None and "audio" in value:
        raise ValueError(
            "audio output is not available: chat deployments answer text (speech: POST /v1/audio/speech)"
        )
    return value


def _no_audio_output(value: ChatAudio | None) -> ChatAudio | None:
    if value is not None:
        raise ValueError(
            "audio output is not available: chat deployments answer text (speech: POST /v1/audio/speech)"
        )
    return value


def _no_moderation(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is not None:
        raise ValueError(
            "moderation is not available: modelhost runs no moderation model, and an answer it did not "
            "check must not pass for a moderated one"
        )
    return value


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


MAX_GRAMMAR = 32_768  # characters of a `structured_outputs` regex or grammar: a format, not a program
MAX_CHOICES = 256  # `structured_outputs.choice` entries
MAX_CHOICE = 1_024  # characters of one choice
GrammarText = Annotated[str, Field(min_length=1, max_length=MAX_GRAMMAR)]
Choices = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=MAX_CHOICE)]],
    Field(min_length=1, max_length=MAX_CHOICES),
]


class StructuredOutputs(StrictModel):
    """vLLM's `structured_outputs` (its `StructuredOutputsParams`): exactly one constraint on the output,
    enforced by constrained decoding as `response_format` is (docs/openai-compat.md)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    json_: dict[str, Any] | str | None = Field(
        default=None, alias="json", description="A JSON Schema (or its JSON text) the output follows."
    )
    regex: GrammarText | None = Field(default=None, description="The whole output matches this regex.")
    choice: Choices | None = Field(default=None, description="The output is one of these strings.")
    grammar: GrammarText | None = Field(
        default=None,
        description="A context-free grammar the output follows: llguidance's Lark (a `start` rule) or "
        "GBNF (a `root` rule), as vLLM's guidance backend takes it.",
    )
    json_object: bool | None = Field(default=None, description="`true`: any JSON object.")
    disable_any_whitespace: bool | None = Field(
        default=None, description="No effect: JSON is always written without whitespace between tokens."
    )
    disable_additional_properties: bool | None = Field(
        default=None, description="`true`: no object takes properties its schema does not list (strict)."
    )
    whitespace_pattern: str | None = Field(default=None, description="Refused (400): JSON is compact.")
    structural_tag: str | None = Field(default=None, description="Refused (400): not supported here.")

    @model_validator(mode="after")
    def _one_constraint(self) -> StructuredOutputs:
        for name in ("whitespace_pattern", "structural_tag"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} is not supported here (docs/openai-compat.md)")
        given = [n for n in ("json_", "regex", "choice", "grammar") if getattr(self, n) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError("give exactly one of json, regex, choice, grammar or json_object: true")
        return self


class StreamOptions(StrictModel):
    include_usage: bool | None = None
    include_obfuscation: bool | None = Field(default=None, description=NO_EFFECT)


class SamplingFields(StrictModel):
    """What chat completions and completions share."""

    model: str = Field(description="Your deployment's model ID.", examples=["chat"])
    temperature: Temperature | None = Field(
        default=None, description="0 = greedy." + MODEL_DEFAULT + ", else 1."
    )
    top_p: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None, description=MODEL_DEFAULT + ", else 1."
    )
    top_k: TopK | None = Field(
        default=None,
        description="Extension (as vLLM): sample from the k most likely tokens; 0 or -1: all."
        + MODEL_DEFAULT
        + ", else all.",
    )
    min_p: MinP | None = Field(
        default=None,
        description="Extension (as vLLM): drop tokens less likely than min_p times the most likely one."
        + MODEL_DEFAULT
        + ", else 0.",
    )
    repetition_penalty: RepetitionPenalty | None = Field(
        default=None,
        description="Extension (as vLLM and transformers): above 1, every token of the prompt and the "
        "output so far is less likely (its logit divided by it if positive, else multiplied)."
        + MODEL_DEFAULT
        + ", else 1.",
    )
    n: Annotated[int, Field(ge=1, le=16)] | None = None
    stop: Stop | None = Field(default=None, description="Generation stops before any of these strings.")
    seed: int | None = Field(default=None, description="Same seed and parameters → same output.")
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logit_bias: LogitBias | None = None
    user: str | None = Field(
        default=None,
        description="Keeps a canary sticky by user (docs/deploy.md), and the user's requests on one "
        "replica, as `prompt_cache_key` does where that is not given (docs/runtime.md, Routing).",
    )
    min_tokens: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Extension (as vLLM): no end-of-sequence before this many tokens."
    )
    stop_token_ids: StopTokenIds | None = Field(
        default=None,
        description="Extension (as vLLM): generation stops at any of these token IDs (up to 64), as at "
        "the end of sequence: the token is not in the text. IDs outside the vocabulary → 400.",
    )
    ignore_eos: bool | None = Field(
        default=None, description="Extension (as vLLM): the end-of-sequence token does not stop generation."
    )
    include_stop_str_in_output: bool | None = Field(
        default=None,
        description="Extension (as vLLM): the stop string, or stop token, that ended generation is in "
        "the text.",
    )
    skip_special_tokens: bool | None = Field(
        default=None,
        description="Extension (as vLLM): `false` keeps special tokens in the text. Default true.",
    )
    structured_outputs: StructuredOutputs | None = Field(
        default=None,
        description="Extension (as vLLM): the output follows a regex, a choice of strings, a grammar or a "
        "JSON Schema, by constrained decoding. Not with `response_format` JSON or a forced tool call.",
    )
    guided_json: dict[str, Any] | str | None = Field(default=None, description=GUIDED + "json`.")
    guided_regex: GrammarText | None = Field(default=None, description=GUIDED + "regex`.")
    guided_choice: Choices | None = Field(default=None, description=GUIDED + "choice`.")
    guided_grammar: GrammarText | None = Field(default=None, description=GUIDED + "grammar`.")
    service_tier: ServiceTier | None = Field(default=None, description=SERVICE_TIER)
    priority: Annotated[int, Field(ge=-PRIORITY_BOUND, le=PRIORITY_BOUND)] | None = Field(
        default=None, description=PRIORITY_FIELD
    )
    cache_salt: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        default=None,
        description="Extension (as vLLM): the request reuses only prompt prefixes cached by requests with "
        "the same salt (and the same key salt, docs/access.md), and reports only those in `cached_tokens`.",
    )


class ChatCompletionRequest(SamplingFields):
    """Every field of OpenAI's chat completion request: honoured, accepted without effect (`NO_EFFECT`)
    or refused with a 400 naming it (docs/openai-compat.md)."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: (
        Annotated[
            list[Annotated[Tool, BeforeValidator(_function_tools_only)]], Field(min_length=1, max_length=128)
        ]
        | None
    ) = None
    tool_choice: ToolChoice | None = None
    chat_template_kwargs: TemplateKwargs | None = Field(
        default=None,
        description="Extension (as vLLM): extra variables for the model's chat template, such as Qwen3's "
        '`{"enable_thinking": false}`. JSON values, up to 16,384 characters; the template\'s own variables '
        "(`messages`, `tools`, `add_generation_prompt`...) → 400.",
    )
    parallel_tool_calls: bool | None = Field(
        default=None, description="`false`: at most one tool call per choice (a forced call is always one)."
    )
    functions: Annotated[list[FunctionDefinition], Field(min_length=1, max_length=128)] | None = Field(
        default=None, description="Deprecated form of `tools`; the answer then carries `function_call`."
    )
    function_call: Literal["none", "auto"] | NamedFunction | None = Field(
        default=None, description="Deprecated form of `tool_choice` (with `functions`)."
    )
    response_format: ResponseFormat | None = None
    modalities: Annotated[list[Literal["text", "audio"]] | None, AfterValidator(_text_only)] = Field(
        default=None, description='`["text"]` only: audio output → 400.'
    )
    audio: Annotated[ChatAudio | None, AfterValidator(_no_audio_output)] = Field(
        default=None, description="Audio output parameters: refused (400), chat deployments answer text."
    )
    moderation: Annotated[dict[str, Any] | None, AfterValidator(_no_moderation)] = Field(
        default=None, description="Refused (400): modelhost runs no moderation model."
    )
    store: bool | None = Field(default=None, description=NO_EFFECT)
    metadata: Metadata | None = Field(default=None, description=NO_EFFECT)
    safety_identifier: str | None = Field(default=None, description=NO_EFFECT)
    prompt_cache_key: str | None = Field(
        default=None,
        max_length=256,
        description="Requests with the same key go to the same replica, whose KV cache holds their common "
        "prefix (docs/runtime.md, Routing); without it, the prompt's leading part decides.",
    )
    prompt_cache_options: dict[str, Any] | None = Field(default=None, description=NO_EFFECT)
    prompt_cache_retention: str | None = Field(default=None, description=NO_EFFECT)
    reasoning_effort: ReasoningEffort | None = Field(
        default=None,
        description="Honoured where the model's family has a switch: `none`/`minimal` turn thinking off, "
        "`low` and above on (Qwen3's `enable_thinking`, DeepSeek-V3.1's and Granite's `thinking`); gpt-oss "
        "takes `low`, `medium`, `high`. A model without a switch → 400 naming it.",
    )
    verbosity: str | None = Field(default=None, description=NO_EFFECT)
    web_search_options: dict[str, Any] | None = Field(default=None, description=NO_EFFECT)
    prediction: Prediction | None = Field(
        default=None, description=NO_EFFECT + " (Predicted outputs only make OpenAI faster.)"
    )


Prompt = (
    Annotated[str, Field(min_length=1)]
    | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=64)]
    | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    | Annotated[
        list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]],
        Field(min_length=1, max_length=64),
    ]
)


class CompletionRequest(SamplingFields):
    prompt: Prompt | None = Field(
        description="null: generation starts from the beginning of a document (the tokenizer's "
        "beginning-of-sequence token, else its end-of-text token), as OpenAI's `<|endoftext|>`."
    )
    max_tokens: Annotated[int, Field(ge=1)] | None = Field(default=16, description="Default 16, as OpenAI.")
    echo: bool | None = None
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    suffix: str | None = Field(
        default=None,
        description="Insert mode: the text that follows the completion. The model writes what goes between "
        "`prompt` and `suffix` (fill-in-the-middle); the answer is that text alone. Needs a model with "
        "fill-in-the-middle tokens, else 400.",
    )
    best_of: Annotated[int, Field(ge=1, le=MAX_BEST_OF)] | None = Field(
        default=None,
        description=f"Generate this many (at most {MAX_BEST_OF}, at least `n`) and return the `n` with "
        "the highest mean log probability per token. Not with `stream`.",
    )


# ---------------------------------------------------------------- /tokenize and /detokenize (as vLLM)


class TokenizeCompletionRequest(StrictModel):
    """vLLM's `TokenizeCompletionRequest`: a prompt's token IDs, as completions would see it."""

    model: str | None = Field(default=None, description="Your deployment's model ID.")
    prompt: str
    add_special_tokens: bool = Field(default=True, description="The tokenizer's own (a BOS token...).")
    return_token_strs: bool | None = Field(default=None, description="Also each token as a string.")


class TokenizeChatRequest(StrictModel):
    """vLLM's `TokenizeChatRequest`: the IDs of the prompt the deployment's chat template renders."""

    model: str | None = Field(default=None, description="Your deployment's model ID.")
    messages: Annotated[list[Message], Field(min_length=1)]
    add_generation_prompt: bool = True
    continue_final_message: bool = Field(
        default=False,
        description="The last message is left open for the model to go on; not with add_generation_prompt.",
    )
    add_special_tokens: bool = Field(default=False, description="The template writes its special tokens.")
    chat_template_kwargs: TemplateKwargs | None = None
    tools: (
        Annotated[
            list[Annotated[Tool, BeforeValidator(_function_tools_only)]], Field(min_length=1, max_length=128)
        ]
        | None
    ) = None
    return_token_strs: bool | None = Field(default=None, description="Also each token as a string.")

    @model_validator(mode="after")
    def _one_ending(self) -> TokenizeChatRequest:
        if self.add_generation_prompt and self.continue_final_message:
            raise ValueError("continue_final_message needs add_generation_prompt: false")
        return self


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(StrictModel):
    model: str | None = Field(default=None, description="Your deployment's model ID.")
    tokens: list[Annotated[int, Field(ge=0)]]


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfoResponse(BaseModel):
    """vLLM's: the tokenizer's configuration as `tokenizer_config.json` has it (more fields than named)."""

    model_config = ConfigDict(extra="allow")
    tokenizer_class: str
    eos_token: str | None = None
    chat_template: str | None = None


# ---------------------------------------------------------------- responses (documentation of the shapes)


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int  # completion tokens generated inside the model's reasoning, its markers included


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens taken from the replica's KV cache (a prefix computed before)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails | None = Field(
        default=None, description="Chat completions only."
    )


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = Field(
        default=None,
        description="A reasoning model's reasoning, apart from its answer (present for those models).",
    )
    reasoning: str | None = Field(default=None, description="The same, under vLLM's newer name.")
    tool_calls: list[ToolCallOut] | None = None
    function_call: FunctionCall | None = Field(
        default=None, description="Instead of `tool_calls` when the request used the deprecated `functions`."
    )
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: Literal["stop", "length", "tool_calls", "function_call"]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    service_tier: Literal["default", "flex", "priority"] = "default"


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
    service_tier: Literal["default", "flex", "priority"] = "default"
