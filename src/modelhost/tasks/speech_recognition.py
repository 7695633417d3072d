"""Speech recognition (OpenAI's `/v1/audio/transcriptions` and `/v1/audio/translations`: a translation is
Whisper's `translate` task, on the transcription path) on transformers' `automatic-speech-recognition`
pipeline, which holds Whisper's timestamp tokens and windows and CTC word offsets. Audio in is decoded by
`modelhost.media.decode` (our limits, no `ffmpeg` program) and handed to the pipeline as samples at the
model's rate. Requests run one at a time inside a batch: clips differ in length."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from modelhost.engines import loader
from modelhost.errors import InvalidRequest, ModelhostError, error_of, item_error
from modelhost.media.decode import decode_audio
from modelhost.media.encode import encode_audio
from modelhost.tasks.media_items import WARMUP_LIMITS

CTC_WINDOW_SECONDS = 30.0  # CTC models have no window of their own; longer audio is cut into these

PAUSE_SECONDS = 0.5  # a pause this long between two words starts a new segment

SEGMENT_SECONDS = 30.0  # and no segment built from words grows longer than this

Kind = Literal["whisper", "ctc", "seq2seq"]


@dataclass
class Recognizer:
    pipe: Any
    kind: Kind
    rate: int
    window: float | None  # seconds the model hears at once; longer audio is chunked
    timestamps: bool  # the model gives segment times (Whisper with timestamp tokens, CTC)
    words: bool  # ... and word times (CTC; Whisper with `alignment_heads`)
    languages: frozenset[str]  # Whisper's language codes; empty: `language` is ignored
    translates: bool = False  # a multilingual Whisper with the `translate` task token


class SpeechRecognition:
    def load(self, model_dir: Path, device: str) -> Recognizer:
        pipe = loader.load_pipeline("automatic-speech-recognition", model_dir, device)
        rate = int(pipe.feature_extractor.sampling_rate)
        if pipe.type == "seq2seq_whisper":
            config = pipe.model.generation_config
            timestamps = _has_timestamp_tokens(pipe.tokenizer, config)
            codes = {key[2:-2] for key in getattr(config, "lang_to_id", None) or {}}  # "<|en|>" → "en"
            if not getattr(config, "is_multilingual", False):
                codes = {"en"}
            aligned = timestamps and getattr(config, "alignment_heads", None) is not None
            window = float(pipe.feature_extractor.chunk_length)
            translates = len(codes) > 1 and "translate" in (getattr(config, "task_to_id", None) or {})
            return Recognizer(
                pipe, "whisper", rate, window, timestamps, aligned, frozenset(codes), translates
            )
        if pipe.type in ("ctc", "ctc_with_lm"):
            return Recognizer(pipe, "ctc", rate, CTC_WINDOW_SECONDS, True, True, frozenset())
        return Recognizer(pipe, "seq2seq", rate, None, False, False, frozenset())

    def warmup_item(self) -> dict[str, Any]:
        silence = encode_audio(np.zeros(16000, dtype=np.float32), 16000, "wav")
        return {"file": silence, "limits": WARMUP_LIMITS, "temperature": 0.0, "words": False}

    @torch.inference_mode()
    def run(self, model: Recognizer, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [self._transcribe(model, item) for item in batch]

    def _transcribe(self, model: Recognizer, item: dict[str, Any]) -> dict[str, Any]:
        if item.get("task") == "translate" and not model.translates:
            name = type(model.pipe.model).__name__
            return item_error(
                f"This model ({name}) cannot translate: only multilingual Whisper models (with the "
                "`translate` task) can; use /v1/audio/transcriptions.",
                "model",
                "endpoint_not_supported",
            )
        if item["words"] and not model.words:
            return item_error(
                "This model cannot give word timestamps (a Whisper model needs `alignment_heads` in its "
                "generation_config.json); ask for `segment` only.",
                "timestamp_granularities",
            )
        try:
            samples = decode_audio(
                item["file"], target_rate=model.rate, max_seconds=item["limits"]["max_seconds"], param="file"
            )
            options = _options(model, item)
        except ModelhostError as exc:
            return error_of(exc)
        duration = samples.size / model.rate
        if model.window is not None and duration > model.window:
            options["chunk_length_s"] = model.window
        try:
            result = model.pipe({"raw": samples, "sampling_rate": model.rate}, **options)
        except (RuntimeError, ValueError, IndexError) as exc:  # e.g. a clip shorter than the model's filters
            return item_error(f"The model cannot transcribe this audio: {exc}", "file")
        return _transcript(model, item, result, duration)


def _has_timestamp_tokens(tokenizer: Any, config: Any) -> bool:
    """Whisper predicts times only with `<|0.00|>`... right after `<|notimestamps|>` in its vocabulary."""
    no_timestamps = getattr(config, "no_timestamps_token_id", None)
    return no_timestamps is not None and tokenizer.convert_tokens_to_ids("<|0.00|>") == no_timestamps + 1


def _options(model: Recognizer, item: dict[str, Any]) -> dict[str, Any]:
    """The pipeline's arguments for one request; bad `language` or `prompt` raise InvalidRequest."""
    if model.kind == "ctc":
        return {"return_timestamps": "word"}
    if model.kind == "seq2seq":
        return {}
    language, prompt = item.get("language"), item.get("prompt")
    if language is not None and language not in model.languages:
        raise InvalidRequest(
            f"This model does not transcribe {language!r}; it knows {', '.join(sorted(model.languages))}.",
            param="language",
        )
    config, limit = model.pipe.model.generation_config, int(model.pipe.model.config.max_target_positions)
    prompt_ids = _prompt_ids(model.pipe.tokenizer, config, prompt, limit) if prompt else None
    # OpenAI's Whisper decodes at most half its context; with a prompt, what the context has left.
    generate: dict[str, Any] = {"max_new_tokens": min(limit // 2, limit - 4 - len(prompt_ids or []))}
    if len(model.languages) > 1:  # multilingual: the asked task, in `language` if given
        generate["task"] = item.get("task", "transcribe")
        if language is not None:
            generate["language"] = language
    if prompt_ids is not None:
        generate["prompt_ids"] = torch.tensor(prompt_ids)
    if item["temperature"] > 0:
        generate.update(do_sample=True, temperature=item["temperature"])
    mode: bool | str = "word" if item["words"] else model.timestamps
    return {"generate_kwargs": generate, "return_timestamps": mode, "return_language": model.timestamps}


def _prompt_ids(tokenizer: Any, config: Any, prompt: str, limit: int) -> list[int]:
    """`<|startofprev|>` and the prompt's last tokens, as OpenAI's Whisper does. Text that reads as a
    special or timestamp token is refused: it would steer the decoder, not prompt it."""
    ids: list[int] = tokenizer(" " + prompt.strip(), add_special_tokens=False)["input_ids"]
    special = set(tokenizer.all_special_ids)
    if any(i in special or i > config.no_timestamps_token_id for i in ids):
        raise InvalidRequest("`prompt` must not contain the model's special tokens.", param="prompt")
    return [tokenizer.convert_tokens_to_ids("<|startofprev|>"), *ids[-(limit // 2 - 1) :]]


Span = tuple[float, float, str]


def _transcript(
    model: Recognizer, item: dict[str, Any], result: dict[str, Any], duration: float
) -> dict[str, Any]:
    """Text, duration, language, segments (and words when asked) with times inside the audio.

    Segments are Whisper's own when it predicts times; built from words (pauses split them) for CTC
    and for Whisper asked for words; one segment of the whole clip for models without times.
    """
    text = str(result["text"])
    chunks = result.get("chunks") or []
    spans = [_span(chunk, duration) for chunk in chunks]
    words = model.kind == "ctc" or item["words"]
    if not chunks:
        segments = [(0.0, round(duration, 3), text)] if text.strip() else []
    else:
        segments = _group(spans) if words else spans
    tokenizer = model.pipe.tokenizer
    language = next((c["language"] for c in chunks if c.get("language")), None) or item.get("language")
    return {
        "text": text.strip(),
        "duration": round(duration, 3),
        "language": language,
        "segments": [
            {"start": s, "end": e, "text": t, "tokens": tokenizer(t, add_special_tokens=False)["input_ids"]}
            for s, e, t in segments
            if t.strip()
        ],
        "words": [{"word": t.strip(), "start": s, "end": e} for s, e, t in spans if t.strip()]
        if item["words"]
        else None,
    }


def _span(chunk: dict[str, Any], duration: float) -> Span:
    """A pipeline chunk's (start, end, text), clamped into the audio: a model may predict times past
    its end, and Whisper leaves the last end open (None) when it stops mid-window."""
    start, end = chunk["timestamp"]
    begin = min(max(float(start or 0.0), 0.0), duration)
    finish = duration if end is None else min(max(float(end), begin), duration)
    return round(begin, 3), round(finish, 3), str(chunk["text"])


def _group(words: list[Span]) -> list[Span]:
    """Words into segments: a new one after a pause of PAUSE_SECONDS or at SEGMENT_SECONDS long.
    Whisper's words carry their leading space; CTC's get one."""
    segments: list[Span] = []
    for start, end, word in words:
        piece = word if word.startswith(" ") else " " + word
        if segments and start - segments[-1][1] < PAUSE_SECONDS and end - segments[-1][0] <= SEGMENT_SECONDS:
            first, _, text = segments[-1]
            segments[-1] = (first, end, text + piece)
        else:
            segments.append((start, end, piece))
    return segments
