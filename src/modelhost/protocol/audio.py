"""OpenAI-compatible audio: `POST /v1/audio/speech` (JSON in, audio bytes out),
`POST /v1/audio/transcriptions` and `POST /v1/audio/translations` (a multipart form in, JSON or text
out). See docs/audio.md."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from modelhost.protocol.common import StrictModel

SpeechFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
TranscriptionFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]
Granularity = Literal["word", "segment"]

# What /docs shows for each speech format; the worker's encoder (media.encode.AUDIO_FORMATS) sets the
# real header, and tests check that the two agree.
SPEECH_CONTENT_TYPES: dict[str, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
SAMPLE_RATE_HEADER = "X-Sample-Rate"


class VoiceRef(StrictModel):
    """OpenAI's custom-voice object; its `id` is read like a voice name."""

    id: str = Field(min_length=1, max_length=64)


class SpeechRequest(StrictModel):
    model: str = Field(description="Your text-to-speech deployment's model ID.", examples=["vits"])
    input: str = Field(
        min_length=1, max_length=4096, description="The text to speak.", examples=["Hello world."]
    )
    voice: Annotated[str, Field(max_length=64)] | VoiceRef | None = Field(
        default=None,
        description=(
            "A speaker of a multi-speaker model: its number (`0`, `1`, ...) or an OpenAI voice name "
            "(`alloy`, `ash`, ... mapped in order onto the model's speakers). Single-speaker models "
            "accept any voice and ignore it."
        ),
        examples=["alloy"],
    )
    instructions: str | None = Field(
        default=None, max_length=4096, description="Accepted for compatibility; no served model uses it."
    )
    response_format: SpeechFormat = Field(
        default="mp3",
        description=f"`pcm`: raw 16-bit little-endian mono at the rate in the `{SAMPLE_RATE_HEADER}` header.",
    )
    speed: float = Field(
        default=1.0,
        ge=0.25,
        le=4.0,
        description="VITS speaks faster or slower; other models' audio is resampled (pitch changes too).",
    )
    stream_format: Literal["audio"] = Field(
        default="audio", description="Only `audio`: the answer is the audio file itself."
    )

    @field_validator("input")
    @classmethod
    def _has_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must contain text, not only whitespace")
        return value


def _segment_only() -> list[Granularity]:
    return ["segment"]


# Transcription fields of OpenAI's newer models that no model served here can honour, and why; any
# value but the empty list is refused (docs/openai-compat.md).
REFUSED_TRANSCRIPTION_FIELDS = {
    "include": "log probabilities are not computed here",
    "known_speaker_names": "speaker diarization is not supported: no model served here tells speakers apart",
    "known_speaker_references": "speaker diarization is not supported: no model served here tells "
    "speakers apart",
}
NO_VAD = (
    "only `auto`: long audio is cut by the model's own window, there is no voice activity detection "
    "whose settings could be honoured"
)


def _auto_chunking(value: object) -> object:
    """`chunking_strategy` is `auto` or nothing; `server_vad` (the SDK's `chunking_strategy[type]`
    fields, or an object) is refused with the reason."""
    if value is None or value == "auto":
        return value
    raise PydanticCustomError("unsupported", NO_VAD)


class SpeechToTextOptions(BaseModel):
    """The form fields that transcriptions and translations share, besides the file (the route adds
    `file`).

    Form values arrive as text, so this model converts (`"0.2"` → 0.2) where request bodies are
    strict; unknown fields are still refused. Errors name the field without the `[]` the OpenAI SDK
    puts after list fields (`timestamp_granularities`).
    """

    model_config = ConfigDict(extra="forbid", loc_by_alias=False, populate_by_name=True)

    model: str = Field(description="Your automatic-speech-recognition deployment's model ID.")
    prompt: str | None = Field(
        default=None, max_length=4096, description="Text preceding the audio (Whisper only)."
    )
    response_format: TranscriptionFormat = Field(default="json")
    temperature: float = Field(
        default=0.0, ge=0.0, le=1.0, description="0 = greedy decoding; above 0 Whisper samples."
    )


class TranslationOptions(SpeechToTextOptions):
    """`POST /v1/audio/translations`: speech in any language Whisper knows to English text."""


class TranscriptionOptions(SpeechToTextOptions):
    """`POST /v1/audio/transcriptions`: the shared fields, and those of transcription only."""

    language: str | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description="ISO-639-1 code (`en`). Whisper transcribes in it; other models ignore it.",
    )
    timestamp_granularities: list[Granularity] = Field(
        default_factory=_segment_only,
        alias="timestamp_granularities[]",
        max_length=2,
        description="With `verbose_json` only. `word` needs a model that can align words (docs/audio.md).",
    )
    stream: bool = Field(default=False, description="Only false: the transcript comes as one answer.")
    chunking_strategy: Annotated[Literal["auto"] | None, BeforeValidator(_auto_chunking)] = Field(
        default=None, description="Only `auto` (what happens anyway): the model's window cuts long audio."
    )
    keywords: list[Annotated[str, Field(max_length=256)]] = Field(
        default_factory=list,
        alias="keywords[]",
        max_length=100,
        description="Accepted for OpenAI compatibility; no effect (a hint that no model served here takes).",
    )
    languages: list[Annotated[str, Field(min_length=1, max_length=32)]] = Field(
        default_factory=list,
        alias="languages[]",
        max_length=100,
        description="Accepted for OpenAI compatibility; no effect (a hint; use `language` to fix one).",
    )
    include: list[str] = Field(
        default_factory=list, alias="include[]", description="Refused: log probabilities are not computed."
    )
    known_speaker_names: list[str] = Field(
        default_factory=list, alias="known_speaker_names[]", description="Refused: no speaker diarization."
    )
    known_speaker_references: list[str] = Field(
        default_factory=list,
        alias="known_speaker_references[]",
        description="Refused: no speaker diarization.",
    )

    @field_validator("include", "known_speaker_names", "known_speaker_references")
    @classmethod
    def _refused(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if value:
            raise PydanticCustomError("unsupported", REFUSED_TRANSCRIPTION_FIELDS[str(info.field_name)])
        return value

    @model_validator(mode="before")
    @classmethod
    def _form_chunking(cls, data: Any) -> Any:
        """The SDK sends a `server_vad` object as `chunking_strategy[type]`... form fields: folded back
        into `chunking_strategy`, so that it is refused naming that field."""
        if not isinstance(data, dict):
            return data
        nested = {k: v for k, v in data.items() if isinstance(k, str) and k.startswith("chunking_strategy[")}
        if not nested or "chunking_strategy" in data:
            return data
        return {**{k: v for k, v in data.items() if k not in nested}, "chunking_strategy": nested}


class TranscriptionWord(BaseModel):
    word: str
    start: float
    end: float


class TranscriptionSegment(BaseModel):
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float | None = Field(description="Not computed: null.")
    compression_ratio: float
    no_speech_prob: float | None = Field(description="Not computed: null.")


class DurationUsage(BaseModel):
    type: Literal["duration"] = "duration"
    seconds: int


def _absent_if_none(value: object) -> bool:
    return value is None


def _absent() -> Any:
    """A field `timestamp_granularities` asks for: absent from the answer, not null, when not asked."""
    return Field(default=None, exclude_if=_absent_if_none)


class Transcription(BaseModel):
    """`response_format: json` of a transcription or a translation (OpenAI's `Transcription`)."""

    text: str
    usage: DurationUsage


class VerboseTranscription(BaseModel):
    """`response_format: verbose_json` of a transcription (OpenAI's `TranscriptionVerbose`): `segments`
    and `words` only as `timestamp_granularities` asks."""

    task: Literal["transcribe"] = "transcribe"
    language: str | None
    duration: float
    text: str
    usage: DurationUsage
    segments: list[TranscriptionSegment] | None = _absent()
    words: list[TranscriptionWord] | None = _absent()


class VerboseTranslation(BaseModel):
    """`response_format: verbose_json` of a translation (OpenAI's `TranslationVerbose`)."""

    task: Literal["translate"] = "translate"
    language: Literal["english"] = Field(default="english", description="The output's: always English.")
    duration: float
    text: str
    usage: DurationUsage
    segments: list[TranscriptionSegment] | None = _absent()


AUDIO_FILE_DESCRIPTION = (
    "The audio: WAV, MP3, FLAC, OGG, WebM, M4A, MP4... (read by its content, not its name). In a "
    "multipart form (what the OpenAI SDK sends), the file itself; in a JSON body, base64, a `data:` URI or "
    "an http(s) URL."
)


class TranscriptionRequest(TranscriptionOptions):
    """The whole transcription request: the options and the audio."""

    file: str = Field(min_length=1, description=AUDIO_FILE_DESCRIPTION)


class TranslationRequest(TranslationOptions):
    """The whole translation request: the options and the audio."""

    file: str = Field(min_length=1, description=AUDIO_FILE_DESCRIPTION)
