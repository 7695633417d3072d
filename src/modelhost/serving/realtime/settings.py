"""A realtime session's settings: what `session.update` set, merged, checked, and shown back.

`session.update` changes only the fields it sets (OpenAI's rule). The merged settings are checked as a
whole before they replace the old ones, so an update that would leave the session unable to answer
(audio output with no text-to-speech deployment) changes nothing and answers an `error` event.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from modelhost.errors import InvalidRequest
from modelhost.protocol.realtime import (
    FunctionTool,
    SemanticVad,
    ServerVad,
    SessionConfig,
    ToolChoice,
    Transcription,
    VoiceId,
)

Modality = Literal["text", "audio"]


@dataclass
class SessionSettings:
    """The session's settings now (defaults: text out, manual turns, no transcription)."""

    instructions: str | None = None
    modalities: list[Modality] = field(default_factory=lambda: ["text"])
    input_format: str = "audio/pcm"
    output_format: str = "audio/pcm"
    transcription: Transcription | None = None
    turn_detection: ServerVad | None = None
    voice: str | None = None
    speed: float | None = None
    speech_model: str | None = None  # the text-to-speech deployment (`audio.output.model`)
    tools: list[FunctionTool] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    temperature: float | None = None
    max_output_tokens: int | Literal["inf"] = "inf"

    def merged(self, update: SessionConfig, chat_model: str) -> SessionSettings:
        """These settings with `update`'s set fields applied, checked (InvalidRequest naming the field)."""
        new = dataclasses.replace(self, tools=list(self.tools))
        fields = update.model_fields_set
        if update.model is not None and update.model != chat_model:
            raise InvalidRequest(
                f"This session runs on {chat_model} (the URL's `model`); it cannot change model.",
                param="session.model",
            )
        if "instructions" in fields:
            new.instructions = update.instructions
        if update.output_modalities is not None:
            new.modalities = list(dict.fromkeys(update.output_modalities))
        if "tools" in fields:
            new.tools = list(update.tools or [])
        if update.tool_choice is not None:
            new.tool_choice = update.tool_choice
        if "temperature" in fields:
            new.temperature = update.temperature
        if update.max_output_tokens is not None:
            new.max_output_tokens = update.max_output_tokens
        audio = update.audio
        given = audio.input if audio is not None else None
        if given is not None:
            chosen = given.model_fields_set
            if given.format is not None:
                new.input_format = given.format.type
            if "transcription" in chosen:
                new.transcription = given.transcription
            if "turn_detection" in chosen:
                detection = given.turn_detection
                if isinstance(detection, SemanticVad):
                    raise InvalidRequest(
                        "semantic_vad is not supported; use server_vad or null (manual turns).",
                        param="session.audio.input.turn_detection.type",
                    )
                new.turn_detection = detection
        out = audio.output if audio is not None else None
        if out is not None:
            chosen = out.model_fields_set
            if out.format is not None:
                new.output_format = out.format.type
            if "voice" in chosen:
                new.voice = out.voice.id if isinstance(out.voice, VoiceId) else out.voice
            if "speed" in chosen:
                new.speed = out.speed
            if "model" in chosen:
                new.speech_model = out.model
        new.check()
        return new

    def check(self) -> None:
        if "audio" in self.modalities and self.speech_model is None:
            raise InvalidRequest(
                "Audio output needs a text-to-speech deployment: set `session.audio.output.model` to its "
                'model ID, or use `output_modalities: ["text"]`.',
                param="session.audio.output.model",
            )

    def shown(self, session_id: str, chat_model: str, expires_at: int) -> dict[str, Any]:
        """The session object of `session.created` and `session.updated` (OpenAI's GA shape)."""
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": chat_model,
            "output_modalities": self.modalities,
            "instructions": self.instructions or "",
            "tools": [tool.model_dump(exclude_none=True) for tool in self.tools],
            "tool_choice": self.tool_choice
            if isinstance(self.tool_choice, str)
            else self.tool_choice.model_dump(),
            "max_output_tokens": self.max_output_tokens,
            "expires_at": expires_at,
            "tracing": None,
            "truncation": "auto",
            "prompt": None,
            "audio": {
                "input": {
                    "format": _format(self.input_format),
                    "transcription": self.transcription.model_dump(exclude_none=True)
                    if self.transcription
                    else None,
                    "turn_detection": self.turn_detection.model_dump(exclude_none=True)
                    if self.turn_detection
                    else None,
                    "noise_reduction": None,
                },
                "output": {
                    "format": _format(self.output_format),
                    "voice": self.voice,
                    "speed": self.speed or 1.0,
                    "model": self.speech_model,
                },
            },
        }


def _format(kind: str) -> dict[str, Any]:
    return {"type": kind, "rate": 24000} if kind == "audio/pcm" else {"type": kind}
