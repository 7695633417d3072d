"""`POST /v1/audio/speech`, `POST /v1/audio/transcriptions` and `POST /v1/audio/translations`
(OpenAI-compatible, api.md §4.16).

Speech answers the audio file itself. Transcription and translation take OpenAI's multipart form and
are one code path (a translation is Whisper's `translate` task): the worker answers text, segments and
words with times, and this module shapes them into the asked `response_format` (JSON, plain text,
SubRip, WebVTT). Details and decisions: docs/audio.md.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Request, Response

from modelhost.api.bodies import MediaBodyRoute, form_openapi
from modelhost.api.deps import CallerPrincipal, ServicesDep, deployment_for, run_inference
from modelhost.api.errors import error_responses
from modelhost.auth.principal import Principal
from modelhost.container import Services
from modelhost.errors import InvalidRequest
from modelhost.media.sources import load_media
from modelhost.protocol.audio import (
    SAMPLE_RATE_HEADER,
    SPEECH_CONTENT_TYPES,
    SpeechRequest,
    SpeechToTextOptions,
    Transcription,
    TranscriptionRequest,
    TranslationRequest,
    VerboseTranscription,
    VerboseTranslation,
    VoiceRef,
)

router = APIRouter(
    tags=["openai"],
    responses=error_responses(400, 401, 402, 404, 413, 429, 502, 503, 504),
    route_class=MediaBodyRoute,  # the SDK's multipart form becomes the JSON body (api.bodies)
)

TEXT = "text/plain; charset=utf-8"
VTT = "text/vtt; charset=utf-8"
VERBOSE_EXAMPLE = {
    "task": "transcribe",
    "language": "english",
    "duration": 2.5,
    "text": "Hello world.",
    "segments": [
        {
            "id": 0,
            "seek": 0,
            "start": 0.0,
            "end": 2.5,
            "text": " Hello world.",
            "tokens": [2425, 1002, 13],
            "temperature": 0.0,
            "avg_logprob": None,
            "compression_ratio": 0.76,
            "no_speech_prob": None,
        }
    ],
    "words": [{"word": "Hello", "start": 0.0, "end": 1.1}, {"word": "world.", "start": 1.2, "end": 2.4}],
    "usage": {"type": "duration", "seconds": 3},
}


Task = Literal["transcribe", "translate"]
TEXT_RESPONSES: dict[str, Any] = {
    "text/plain": {"schema": {"type": "string"}, "example": "Hello world.\n"},
    "text/vtt": {
        "schema": {"type": "string"},
        "example": "WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello world.\n",
    },
}


@router.post(
    "/v1/audio/speech",
    summary="Text to speech (OpenAI-compatible): the audio file itself",
    response_class=Response,
    responses={
        200: {
            "description": f"The audio; its sampling rate is in the `{SAMPLE_RATE_HEADER}` header.",
            "content": {
                content_type: {"schema": {"type": "string", "format": "binary"}}
                for content_type in SPEECH_CONTENT_TYPES.values()
            },
            "headers": {SAMPLE_RATE_HEADER: {"schema": {"type": "integer"}, "description": "Samples/s."}},
        }
    },
)
async def create_speech(body: SpeechRequest, request: Request, principal: CallerPrincipal) -> Response:
    deployment = await deployment_for(request, principal, body.model)
    voice = body.voice.id if isinstance(body.voice, VoiceRef) else body.voice
    item = {"input": body.input, "voice": voice, "speed": body.speed, "response_format": body.response_format}
    output = await run_inference(request, deployment.runtime_key, item)
    return Response(
        output["audio"],
        media_type=output["content_type"],
        headers={SAMPLE_RATE_HEADER: str(output["sampling_rate"])},
    )


@router.post(
    "/v1/audio/transcriptions",
    summary="Speech to text (OpenAI-compatible): JSON, text, SubRip or WebVTT",
    response_model=Transcription | VerboseTranscription,
    responses={
        200: {
            "description": "`json`, `verbose_json`: JSON; `text`, `srt`: text/plain; `vtt`: text/vtt.",
            "content": {"application/json": {"example": VERBOSE_EXAMPLE}, **TEXT_RESPONSES},
        }
    },
    openapi_extra={
        "requestBody": {"content": form_openapi("/v1/audio/transcriptions", TranscriptionRequest)}
    },
)
async def create_transcription(
    form: TranscriptionRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    if form.stream:
        raise InvalidRequest(
            "Streaming transcriptions are not supported; leave `stream` false.", param="stream"
        )
    if "timestamp_granularities" in form.model_fields_set and form.response_format != "verbose_json":
        raise InvalidRequest(
            "`timestamp_granularities` needs `response_format` verbose_json.", param="timestamp_granularities"
        )
    words = "word" in form.timestamp_granularities
    output = await _recognize(request, services, principal, form, "transcribe", form.language, words)
    return _shape(form, output, form.timestamp_granularities)


@router.post(
    "/v1/audio/translations",
    summary="Speech in another language to English text (OpenAI-compatible; Whisper models)",
    response_model=Transcription | VerboseTranslation,
    responses={
        200: {
            "description": "`json`, `verbose_json`: JSON; `text`, `srt`: text/plain; `vtt`: text/vtt.",
            "content": {"application/json": {}, **TEXT_RESPONSES},
        }
    },
    openapi_extra={"requestBody": {"content": form_openapi("/v1/audio/translations", TranslationRequest)}},
)
async def create_translation(
    form: TranslationRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    output = await _recognize(request, services, principal, form, "translate", None, False)
    return _shape(form, output, ["segment"], task="translate")


async def _recognize(
    request: Request,
    services: Services,
    principal: Principal,
    form: TranscriptionRequest | TranslationRequest,
    task: Task,
    language: str | None,
    words: bool,
) -> dict[str, Any]:
    """Run the speech recognition deployment on the request's audio: text, duration, segments, words."""
    deployment = await deployment_for(request, principal, form.model)
    settings = services.settings
    data = await load_media(form.file, services.media, param="file", timeout=None)
    item = {
        "file": data,
        "limits": {"max_seconds": settings.media_max_seconds},
        "task": task,
        "language": language,
        "prompt": form.prompt,
        "temperature": form.temperature,
        "words": words,
    }
    return await run_inference(request, deployment.runtime_key, item)


def _shape(
    form: SpeechToTextOptions,
    output: dict[str, Any],
    granularities: Sequence[str],
    task: Task = "transcribe",
) -> Response:
    segments = _segments(output["segments"], form.temperature)
    fmt = form.response_format
    if fmt == "text":
        return Response(output["text"] + "\n", media_type=TEXT)
    if fmt == "srt":
        return Response(_subrip(segments), media_type=TEXT)
    if fmt == "vtt":
        return Response(_webvtt(segments), media_type=VTT)
    body: dict[str, Any] = {
        "text": output["text"],
        "usage": {"type": "duration", "seconds": math.ceil(output["duration"])},
    }
    if fmt == "verbose_json":
        body = {
            "task": task,
            # A translation's language is its output's (OpenAI: always english).
            "language": "english" if task == "translate" else output["language"],
            "duration": output["duration"],
            **body,
            **({"segments": segments} if "segment" in granularities else {}),
            **({"words": output["words"]} if "word" in granularities else {}),
        }
    return Response(orjson.dumps(body), media_type="application/json")


def _segments(raw: list[dict[str, Any]], temperature: float) -> list[dict[str, Any]]:
    """OpenAI's segment objects. `seek` is the start in 10 ms frames (Whisper's mel frames);
    `avg_logprob` and `no_speech_prob` are not computed (null); `compression_ratio` is Whisper's."""
    return [
        {
            "id": index,
            "seek": round(segment["start"] * 100),
            "start": segment["start"],
            "end": segment["end"],
            "text": segment["text"],
            "tokens": segment["tokens"],
            "temperature": temperature,
            "avg_logprob": None,
            "compression_ratio": _compression_ratio(segment["text"]),
            "no_speech_prob": None,
        }
        for index, segment in enumerate(raw)
    ]


def _compression_ratio(text: str) -> float:
    """Whisper's repetition signal: text bytes over their zlib size (above 2.4: likely looping)."""
    data = text.encode()
    return round(len(data) / len(zlib.compress(data)), 3) if data else 0.0


def _clock(seconds: float, separator: str) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    return f"{hours:02d}:{minutes:02d}:{millis // 1000:02d}{separator}{millis % 1000:03d}"


def _subrip(segments: list[dict[str, Any]]) -> str:
    return "".join(
        f"{i}\n{_clock(s['start'], ',')} --> {_clock(s['end'], ',')}\n{s['text'].strip()}\n\n"
        for i, s in enumerate(segments, start=1)
    )


def _webvtt(segments: list[dict[str, Any]]) -> str:
    cues = "".join(
        f"{_clock(s['start'], '.')} --> {_clock(s['end'], '.')}\n{s['text'].strip()}\n\n" for s in segments
    )
    return f"WEBVTT\n\n{cues}"
