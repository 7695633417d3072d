"""OpenAI's Realtime API over WebSocket (`/v1/realtime`, docs/realtime.md): the client's events and the
objects the server's events carry.

The client's events are one discriminated union on `type` (`ClientEvent`), parsed from each text frame:
an unknown `type`, a missing field or a field of the wrong type is an `error` event naming it, as
OpenAI's server answers. Field names are the GA protocol's (what openai-python 2.x/3.x sends:
`session.audio.input.format`, `output_modalities`, `max_output_tokens`); the beta protocol's flat names
(`input_audio_format: "pcm16"`, `input_audio_transcription`, `turn_detection`, `modalities`, `voice`,
`max_response_output_tokens`) are read as their GA places, so older clients work too.

Our one extension: `session.audio.output.model` names the text-to-speech deployment that speaks the
answers (OpenAI's model speaks itself; here speech is a deployment of its own, as the transcription
model already is in OpenAI's protocol).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

MAX_EVENT_ID = 128  # characters of a client's `event_id`
MAX_ITEM_ID = 128
MAX_TEXT = 256 * 1024  # characters of one text part or function output
MAX_INSTRUCTIONS = 64 * 1024
MAX_TOOLS = 128
SAMPLE_RATE = 24_000  # `audio/pcm`: 16-bit little-endian mono at 24 kHz, the protocol's only rate

# the beta protocol's format names → the GA format's `type`
BETA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}


class Model(BaseModel):
    """Client objects: unknown fields are refused (an `error` event names them), as OpenAI's server does."""

    model_config = ConfigDict(extra="forbid")


def _format(value: Any) -> Any:
    """A beta format name (`"pcm16"`) read as the GA object (`{"type": "audio/pcm"}`)."""
    if isinstance(value, str) and value in BETA_FORMATS:
        return {"type": BETA_FORMATS[value]}
    return value


class AudioFormat(Model):
    """`audio/pcm` (16-bit little-endian PCM at 24 kHz), `audio/pcmu` (G.711 µ-law, 8 kHz) or
    `audio/pcma` (G.711 A-law, 8 kHz)."""

    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] = "audio/pcm"
    rate: Literal[24000] | None = None


Format = Annotated[AudioFormat, BeforeValidator(_format)]


class Transcription(Model):
    """`model`: your automatic-speech-recognition deployment's model ID; the user's audio turns are
    transcribed by it (`conversation.item.input_audio_transcription.completed`)."""

    model: Annotated[str, Field(min_length=1, max_length=128)]
    language: Annotated[str, Field(max_length=32)] | None = None
    prompt: Annotated[str, Field(max_length=4096)] | None = None


class ServerVad(Model):
    """Turns found by the server's voice activity detection (OpenAI's defaults)."""

    type: Literal["server_vad"]
    threshold: Annotated[float, Field(ge=0, le=1)] = 0.5
    prefix_padding_ms: Annotated[int, Field(ge=0, le=10_000)] = 300
    silence_duration_ms: Annotated[int, Field(ge=0, le=10_000)] = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: Annotated[int, Field(ge=0)] | None = None


class SemanticVad(Model):
    type: Literal["semantic_vad"]
    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None


TurnDetection = Annotated[ServerVad | SemanticVad, Field(discriminator="type")]


class NoiseReduction(Model):
    type: Literal["near_field", "far_field"] | None = None


class AudioInput(Model):
    format: Format | None = None
    transcription: Transcription | None = None
    turn_detection: TurnDetection | None = None
    noise_reduction: NoiseReduction | None = Field(default=None, description="Accepted; no effect.")


class VoiceId(Model):
    id: Annotated[str, Field(max_length=128)]


class AudioOutput(Model):
    """`model` (our extension): your text-to-speech deployment's model ID, which speaks the answers;
    `voice`: the voice (speaker) it speaks with, as `/v1/audio/speech` takes it."""

    format: Format | None = None
    voice: Annotated[str, Field(max_length=128)] | VoiceId | None = None
    speed: Annotated[float, Field(ge=0.25, le=4.0)] | None = None
    model: Annotated[str, Field(min_length=1, max_length=128)] | None = None


class AudioConfig(Model):
    input: AudioInput | None = None
    output: AudioOutput | None = None


class FunctionTool(Model):
    type: Literal["function"] = "function"
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: Annotated[str, Field(max_length=8192)] | None = None
    parameters: dict[str, Any] | None = None


class NamedFunction(Model):
    type: Literal["function"]
    name: str


ToolChoice = Literal["auto", "none", "required"] | NamedFunction
Modalities = Annotated[list[Literal["text", "audio"]], Field(min_length=1, max_length=2)]
MaxTokens = Annotated[int, Field(ge=1, le=4096)] | Literal["inf"]


class SessionConfig(Model):
    """`session.update`'s `session`: the fields it sets change, the others stay as they were."""

    type: Literal["realtime"] | None = None
    model: Annotated[str, Field(max_length=128)] | None = Field(
        default=None, description="The chat deployment, fixed by the URL's `?model=`; another is refused."
    )
    instructions: Annotated[str, Field(max_length=MAX_INSTRUCTIONS)] | None = None
    output_modalities: Modalities | None = None
    audio: AudioConfig | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    max_output_tokens: MaxTokens | None = None
    parallel_tool_calls: bool | None = None
    tracing: Any = Field(default=None, description="Accepted; no effect.")
    truncation: Any = Field(default=None, description="Accepted; no effect (the oldest items are dropped).")
    include: list[str] | None = Field(default=None, description="Accepted; no effect.")
    # the beta protocol's names, read as their GA places (`_beta_names`)
    modalities: Modalities | None = None
    voice: Annotated[str, Field(max_length=128)] | None = None
    input_audio_format: Format | None = None
    output_audio_format: Format | None = None
    input_audio_transcription: Transcription | None = None
    turn_detection: TurnDetection | None = None
    max_response_output_tokens: MaxTokens | None = None

    @model_validator(mode="after")
    def _beta_names(self) -> SessionConfig:
        """The beta protocol's flat fields moved to their GA places (set only where the GA one is not)."""
        fields = self.model_fields_set
        audio = self.audio or AudioConfig()
        given = audio.input or AudioInput()
        out = audio.output or AudioOutput()
        if "modalities" in fields and self.output_modalities is None:
            self.output_modalities = self.modalities
        if "max_response_output_tokens" in fields and self.max_output_tokens is None:
            self.max_output_tokens = self.max_response_output_tokens
        moved = False
        for beta, place, name in (
            ("input_audio_format", given, "format"),
            ("input_audio_transcription", given, "transcription"),
            ("turn_detection", given, "turn_detection"),
            ("output_audio_format", out, "format"),
            ("voice", out, "voice"),
        ):
            if beta in fields and name not in place.model_fields_set:
                setattr(place, name, getattr(self, beta))
                moved = True
        if moved:
            self.audio = AudioConfig(input=given, output=out)
        return self


# ---------------------------------------------------------------- conversation items


class InputText(Model):
    type: Literal["input_text"]
    text: Annotated[str, Field(max_length=MAX_TEXT)]


class InputAudio(Model):
    """Base64 audio in the session's input format; transcribed by the session's transcription model."""

    type: Literal["input_audio"]
    audio: str | None = None
    transcript: Annotated[str, Field(max_length=MAX_TEXT)] | None = None


class OutputText(Model):
    type: Literal["output_text", "text"]
    text: Annotated[str, Field(max_length=MAX_TEXT)]


class OutputAudio(Model):
    type: Literal["output_audio", "audio"]
    audio: str | None = None
    transcript: Annotated[str, Field(max_length=MAX_TEXT)] | None = None


Part = Annotated[InputText | InputAudio | OutputText | OutputAudio, Field(discriminator="type")]
ItemId = Annotated[str, Field(min_length=1, max_length=MAX_ITEM_ID)]


class MessageItem(Model):
    type: Literal["message"]
    role: Literal["user", "assistant", "system"]
    content: Annotated[list[Part], Field(min_length=1, max_length=32)]
    id: ItemId | None = None
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None


class FunctionCallItem(Model):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1, max_length=128)]
    name: Annotated[str, Field(min_length=1, max_length=64)]
    arguments: Annotated[str, Field(max_length=MAX_TEXT)]
    id: ItemId | None = None
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None


class FunctionCallOutputItem(Model):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1, max_length=128)]
    output: Annotated[str, Field(max_length=MAX_TEXT)]
    id: ItemId | None = None
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None


ItemIn = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")]


class ResponseParams(Model):
    """`response.create`'s `response`: this response's own settings over the session's."""

    instructions: Annotated[str, Field(max_length=MAX_INSTRUCTIONS)] | None = None
    output_modalities: Modalities | None = None
    modalities: Modalities | None = None  # beta name
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    max_output_tokens: MaxTokens | None = None
    max_response_output_tokens: MaxTokens | None = None  # beta name
    conversation: Literal["auto", "none"] | None = None
    input: Annotated[list[ItemIn], Field(max_length=256)] | None = None
    metadata: dict[str, str] | None = None
    audio: AudioConfig | None = Field(default=None, description="`output.voice` is honoured.")
    voice: Annotated[str, Field(max_length=128)] | None = None  # beta name


# ---------------------------------------------------------------- client events


EventId = Annotated[str, Field(max_length=MAX_EVENT_ID)] | None


class SessionUpdate(Model):
    type: Literal["session.update"]
    session: SessionConfig
    event_id: EventId = None


class AudioAppend(Model):
    type: Literal["input_audio_buffer.append"]
    audio: str
    event_id: EventId = None


class AudioCommit(Model):
    type: Literal["input_audio_buffer.commit"]
    event_id: EventId = None


class AudioClear(Model):
    type: Literal["input_audio_buffer.clear"]
    event_id: EventId = None


class ItemCreate(Model):
    type: Literal["conversation.item.create"]
    item: ItemIn
    previous_item_id: ItemId | None = None
    event_id: EventId = None


class ItemDelete(Model):
    type: Literal["conversation.item.delete"]
    item_id: ItemId
    event_id: EventId = None


class ItemRetrieve(Model):
    type: Literal["conversation.item.retrieve"]
    item_id: ItemId
    event_id: EventId = None


class ItemTruncate(Model):
    type: Literal["conversation.item.truncate"]
    item_id: ItemId
    content_index: Annotated[int, Field(ge=0)]
    audio_end_ms: Annotated[int, Field(ge=0)]
    event_id: EventId = None


class ResponseCreate(Model):
    type: Literal["response.create"]
    response: ResponseParams | None = None
    event_id: EventId = None


class ResponseCancel(Model):
    type: Literal["response.cancel"]
    response_id: Annotated[str, Field(max_length=128)] | None = None
    event_id: EventId = None


ClientEvent = Annotated[
    SessionUpdate
    | AudioAppend
    | AudioCommit
    | AudioClear
    | ItemCreate
    | ItemDelete
    | ItemRetrieve
    | ItemTruncate
    | ResponseCreate
    | ResponseCancel,
    Field(discriminator="type"),
]
CLIENT_EVENT_TYPES = (
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "conversation.item.create",
    "conversation.item.delete",
    "conversation.item.retrieve",
    "conversation.item.truncate",
    "response.create",
    "response.cancel",
)


# ---------------------------------------------------------------- what the server's events carry


class ErrorDetail(BaseModel):
    """An `error` event's `error`: OpenAI's error object, with the client event it answers."""

    type: str
    code: str | None = None
    message: str
    param: str | None = None
    event_id: str | None = None


class ContentOut(BaseModel):
    type: Literal["input_text", "input_audio", "output_text", "output_audio"]
    text: str | None = None
    transcript: str | None = None
    audio: str | None = None


class Item(BaseModel):
    """A conversation item as the server's events show it (`realtime.item`)."""

    id: str
    type: Literal["message", "function_call", "function_call_output"]
    object: Literal["realtime.item"] = "realtime.item"
    status: Literal["completed", "incomplete", "in_progress"] = "completed"
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentOut] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


class TokenDetails(BaseModel):
    text_tokens: int = 0
    audio_tokens: int = 0
    cached_tokens: int | None = None


class ResponseUsage(BaseModel):
    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: TokenDetails = Field(default_factory=lambda: TokenDetails(cached_tokens=0))
    output_token_details: TokenDetails = Field(default_factory=TokenDetails)


class StatusDetails(BaseModel):
    type: Literal["completed", "cancelled", "incomplete", "failed"]
    reason: Literal["turn_detected", "client_cancelled", "max_output_tokens", "content_filter"] | None = None
    error: ErrorDetail | None = None


class Response(BaseModel):
    """A response as `response.created` and `response.done` show it (`realtime.response`)."""

    id: str
    object: Literal["realtime.response"] = "realtime.response"
    status: Literal["in_progress", "completed", "cancelled", "incomplete", "failed"] = "in_progress"
    status_details: StatusDetails | None = None
    output: list[Item] = Field(default_factory=list)
    output_modalities: list[Literal["text", "audio"]]
    conversation_id: str | None = None
    max_output_tokens: int | Literal["inf"] = "inf"
    usage: ResponseUsage | None = None
    metadata: dict[str, str] | None = None
