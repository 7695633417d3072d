"""Text to speech (OpenAI's `/v1/audio/speech`) on transformers' `text-to-audio` pipeline, which holds
each model family's pre- and post-processing (VITS tokenizers…); audio out is encoded by
`modelhost.media.encode`. Requests run one at a time inside a batch: texts differ in length, and each
request is seeded on its own so that the same request always gives the same bytes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from modelhost.engines import loader
from modelhost.errors import item_error
from modelhost.media.decode import resample
from modelhost.media.encode import AUDIO_FORMATS, OPUS_RATES, encode_audio

# OpenAI's voice names, in the order its SDK lists them; on a model with N speakers the i-th name is
# speaker i mod N, so every name works and the first N are distinct speakers.
OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx",
    "nova", "sage", "shimmer", "verse", "marin", "cedar",
)  # fmt: skip

SPEECH_SEED = 0


@dataclass
class Speaker:
    pipe: Any
    speakers: int  # above 1, `voice` picks one
    vits: bool  # VITS speaks at any `speaking_rate`; other models' audio is resampled for `speed`


def speaker_id(voice: str | None, speakers: int) -> int | None:
    """The speaker a voice names: a number below `speakers`, or an OpenAI voice name; None: unknown."""
    if voice is None:
        return 0
    if voice.isdigit():
        return int(voice) if int(voice) < speakers else None
    if voice in OPENAI_VOICES:
        return OPENAI_VOICES.index(voice) % speakers
    return None


class TextToSpeech:
    def load(self, model_dir: Path, device: str) -> Speaker:
        pipe = loader.load_pipeline("text-to-audio", model_dir, device)
        vits = pipe.model.config.model_type == "vits"
        speakers = int(getattr(pipe.model.config, "num_speakers", 1) or 1) if vits else 1
        return Speaker(pipe, speakers, vits)

    def warmup_item(self) -> dict[str, Any]:
        return {"input": "hello", "voice": None, "speed": 1.0, "response_format": "wav"}

    @torch.inference_mode()
    def run(self, model: Speaker, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [self._speak(model, item) for item in batch]

    def _speak(self, model: Speaker, item: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if model.speakers > 1:
            speaker = speaker_id(item["voice"], model.speakers)
            if speaker is None:
                return item_error(
                    f"Unknown voice {item['voice']!r}: this model has {model.speakers} speakers; use 0 to "
                    f"{model.speakers - 1} or one of {', '.join(OPENAI_VOICES)}.",
                    "voice",
                )
            params["speaker_id"] = speaker
        if model.vits:
            params["speaking_rate"] = item["speed"]
        torch.manual_seed(SPEECH_SEED)  # VITS samples durations and noise: seeded, a request is repeatable
        try:
            out = model.pipe(item["input"], forward_params=params)
        except (RuntimeError, ValueError, IndexError) as exc:  # e.g. no character the tokenizer knows
            return item_error(f"The model cannot speak this input: {exc}", "input")
        samples, rate = _mono(out["audio"]), int(out["sampling_rate"])
        if not model.vits and item["speed"] != 1.0:  # played faster or slower, like a tape
            samples = resample(samples, round(rate * item["speed"]), rate)
        fmt = item["response_format"]
        return {
            "audio": encode_audio(samples, rate, fmt),
            "content_type": AUDIO_FORMATS[fmt][2],
            "sampling_rate": 48000 if fmt == "opus" and rate not in OPUS_RATES else rate,
        }


def _mono(audio: Any) -> np.ndarray:
    """Float32 mono samples; channels (the shorter axis) are averaged, NaN from a broken model is 0."""
    samples = np.asarray(audio, dtype=np.float32)
    if samples.ndim > 1:
        samples = samples.mean(axis=int(np.argmin(samples.shape)), dtype=np.float32).reshape(-1)
    return np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0)
