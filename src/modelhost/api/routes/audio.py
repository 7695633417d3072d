"""`POST /v1/audio/speech`, `POST /v1/audio/transcriptions` and `POST /v1/audio/translations`
(OpenAI-compatible, api.md §4.16).

Speech answers the audio file itself. Transcription and translation take OpenAI's multipart form and
are one code path (a translation is Whisper's `translate` task): the worker answers text, segments and
words with times, and `serving.audio` shapes them into the asked `response_format` (JSON, plain text,
SubRip, WebVTT). Details and decisions: docs/audio.md.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from modelhost.api.answers import json_answer
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
    Transcription,
    TranscriptionRequest,
    TranslationRequest,
    VerboseTranscription,
    VerboseTranslation,
)
from modelhost.serving.audio import (
    Task,
    TextTranscript,
    Transcript,
    recognition_item,
    speech_item,
    transcript,
)

router = APIRouter(
    tags=["openai"],
    responses=error_responses(400, 401, 402, 404, 413, 429, 502, 503, 504),
    route_class=MediaBodyRoute,  # the SDK's multipart form becomes the JSON body (api.bodies)
)

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
    output = await run_inference(request, deployment.runtime_key, speech_item(body))
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
    return _respond(transcript(form, output, form.timestamp_granularities))


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
    return _respond(transcript(form, output, ["segment"], task="translate"))


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
    item = recognition_item(form, data, task, language, words, settings.media_max_seconds)
    return await run_inference(request, deployment.runtime_key, item)


def _respond(answer: Transcript) -> Response:
    if isinstance(answer, TextTranscript):
        return Response(answer.text, media_type=answer.media_type)
    return json_answer(answer)
