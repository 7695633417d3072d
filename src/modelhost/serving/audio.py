"""OpenAI audio served on text-to-speech and speech-recognition deployments (`POST /v1/audio/speech`,
`/v1/audio/transcriptions`, `/v1/audio/translations`; api.md §4.16, docs/audio.md).

Speech answers the audio file itself. Transcription and translation are one path (a translation is
Whisper's `translate` task): the worker answers text, segments and words with times, and `transcript`
shapes them into the asked `response_format`: OpenAI's `Transcription` (json), its verbose objects
(verbose_json), or text (plain text, SubRip, WebVTT) with its media type.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from modelhost.protocol.audio import (
    DurationUsage,
    SpeechRequest,
    SpeechToTextOptions,
    Transcription,
    TranscriptionSegment,
    TranscriptionWord,
    VerboseTranscription,
    VerboseTranslation,
    VoiceRef,
)

Task = Literal["transcribe", "translate"]
TEXT = "text/plain; charset=utf-8"
VTT = "text/vtt; charset=utf-8"


@dataclass(frozen=True)
class TextTranscript:
    """`response_format` text, srt or vtt: the text and its media type."""

    text: str
    media_type: str


Transcript = Transcription | VerboseTranscription | VerboseTranslation | TextTranscript


def speech_item(body: SpeechRequest) -> dict[str, Any]:
    """What the worker needs to speak the input."""
    voice = body.voice.id if isinstance(body.voice, VoiceRef) else body.voice
    return {"input": body.input, "voice": voice, "speed": body.speed, "response_format": body.response_format}


def recognition_item(
    form: SpeechToTextOptions,
    audio: bytes,
    task: Task,
    language: str | None,
    words: bool,
    max_seconds: float,
) -> dict[str, Any]:
    """What the worker needs to transcribe (or translate) `audio` of at most `max_seconds`."""
    return {
        "file": audio,
        "limits": {"max_seconds": max_seconds},
        "task": task,
        "language": language,
        "prompt": form.prompt,
        "temperature": form.temperature,
        "words": words,
    }


def transcript(
    form: SpeechToTextOptions,
    output: dict[str, Any],
    granularities: Sequence[str],
    task: Task = "transcribe",
) -> Transcript:
    """The worker's recognition in the asked `response_format`; `granularities` (`segment`, `word`)
    say what verbose_json includes."""
    segments = _segments(output["segments"], form.temperature)
    fmt = form.response_format
    if fmt == "text":
        return TextTranscript(output["text"] + "\n", TEXT)
    if fmt == "srt":
        return TextTranscript(_subrip(segments), TEXT)
    if fmt == "vtt":
        return TextTranscript(_webvtt(segments), VTT)
    usage = DurationUsage(seconds=math.ceil(output["duration"]))
    if fmt != "verbose_json":
        return Transcription(text=output["text"], usage=usage)
    timed = segments if "segment" in granularities else None
    if task == "translate":  # a translation's language is its output's (OpenAI: always english)
        return VerboseTranslation(
            duration=output["duration"], text=output["text"], usage=usage, segments=timed
        )
    words = output["words"] if "word" in granularities else None
    return VerboseTranscription(
        language=output["language"],
        duration=output["duration"],
        text=output["text"],
        usage=usage,
        segments=timed,
        words=None if words is None else [TranscriptionWord(**word) for word in words],
    )


def _segments(raw: list[dict[str, Any]], temperature: float) -> list[TranscriptionSegment]:
    """OpenAI's segment objects. `seek` is the start in 10 ms frames (Whisper's mel frames);
    `avg_logprob` and `no_speech_prob` are not computed (null); `compression_ratio` is Whisper's."""
    return [
        TranscriptionSegment(
            id=index,
            seek=round(segment["start"] * 100),
            start=segment["start"],
            end=segment["end"],
            text=segment["text"],
            tokens=segment["tokens"],
            temperature=temperature,
            avg_logprob=None,
            compression_ratio=_compression_ratio(segment["text"]),
            no_speech_prob=None,
        )
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


def _subrip(segments: list[TranscriptionSegment]) -> str:
    return "".join(
        f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n\n"
        for i, s in enumerate(segments, start=1)
    )


def _webvtt(segments: list[TranscriptionSegment]) -> str:
    cues = "".join(f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n\n" for s in segments)
    return f"WEBVTT\n\n{cues}"
