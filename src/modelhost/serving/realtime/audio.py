"""The protocol's audio formats, converted with the one media decoder and encoder (`modelhost.media`).

`audio/pcm` is 16-bit little-endian mono at 24 kHz; `audio/pcmu` and `audio/pcma` are G.711 µ-law and
A-law at 8 kHz (telephony). A committed turn goes to the speech-recognition deployment as a WAV file
(its worker decodes and resamples it as every uploaded clip); speech from the text-to-speech deployment
comes back as raw PCM at the model's rate and is resampled to the session's output format here.
"""

from __future__ import annotations

import numpy as np

from modelhost.media.decode import g711_samples, pcm16_samples, resample
from modelhost.media.encode import encode_audio, encode_g711

RATES = {"audio/pcm": 24_000, "audio/pcmu": 8_000, "audio/pcma": 8_000}
SAMPLE_BYTES = {"audio/pcm": 2, "audio/pcmu": 1, "audio/pcma": 1}
LAWS = {"audio/pcmu": "ulaw", "audio/pcma": "alaw"}


def seconds(size: int, fmt: str) -> float:
    """How long `size` bytes of `fmt` play."""
    return size / (SAMPLE_BYTES[fmt] * RATES[fmt])


def samples(data: bytes, fmt: str, param: str) -> np.ndarray:
    """Mono float32 at the format's own rate (`RATES`)."""
    if fmt in LAWS:
        return g711_samples(data, LAWS[fmt])
    return pcm16_samples(data, param=param)


def wav_of(data: bytes, fmt: str, param: str) -> bytes:
    """A turn's audio as the WAV file a speech-recognition deployment reads."""
    return encode_audio(samples(data, fmt, param), RATES[fmt], "wav")


def encoded(pcm: bytes, rate: int, fmt: str) -> bytes:
    """A text-to-speech deployment's raw 16-bit PCM at `rate`, in the session's output format."""
    mono = resample(pcm16_samples(pcm, param="audio"), rate, RATES[fmt])
    if fmt in LAWS:
        return encode_g711(mono, LAWS[fmt])
    return encode_audio(mono, RATES[fmt], "pcm")
