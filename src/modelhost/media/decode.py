"""Decoding media bytes into what pipelines take: mono float32 audio and RGB frames (images: `media.image`).

These run inside worker processes, on bytes a client chose, so every size is checked from the
header before the expensive part: image dimensions before pixels (pixel bombs), audio and video
duration before decoding everything, and every failure of a third-party decoder becomes one
InvalidMedia naming the request field. Plain functions, no asyncio, no gateway imports.
"""

from __future__ import annotations

import io
import math
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

import av
import av.container
import av.stream
import numpy as np
import soundfile as sf  # type: ignore[import-untyped]
from PIL import Image
from scipy.signal import resample_poly  # type: ignore[import-untyped]

from modelhost.errors import InvalidMedia
from modelhost.media.image import decode_image

MAX_SAMPLING_RATE = 384_000
# What PyAV raises for bytes it cannot demux or decode (InvalidDataError is also a ValueError).
_AV_ERRORS = (av.FFmpegError, ValueError, OSError)


# ---------------------------------------------------------------- audio


def decode_audio(data: bytes, *, target_rate: int, max_seconds: float, param: str) -> np.ndarray:
    """Mono float32 samples at `target_rate` from a WAV, FLAC, OGG, MP3 or other audio file.

    libsndfile (soundfile) reads the common formats exactly; anything it cannot open (AAC, M4A,
    WebM/Opus, audio tracks of videos...) goes through FFmpeg's decoders via PyAV.
    """
    if not data:
        raise InvalidMedia(f"Audio in `{param}` is empty", param=param)
    decoded = _read_soundfile(data, max_seconds, param)
    samples, rate = decoded if decoded is not None else _read_pyav(data, max_seconds, param)
    return _finish_audio(samples, rate, target_rate, param)


def audio_from_samples(
    samples: Sequence[float] | np.ndarray,
    sampling_rate: int,
    *,
    target_rate: int,
    max_seconds: float,
    param: str,
) -> np.ndarray:
    """Validates raw mono samples sent as numbers and brings them to `target_rate`."""
    if isinstance(sampling_rate, bool) or not isinstance(sampling_rate, int | np.integer):
        raise InvalidMedia(f"`sampling_rate` of `{param}` must be an integer", param=param)
    if not 1 <= sampling_rate <= MAX_SAMPLING_RATE:
        raise InvalidMedia(
            f"`sampling_rate` of `{param}` must be between 1 and {MAX_SAMPLING_RATE}", param=param
        )
    try:
        array = np.asarray(samples)
    except (ValueError, TypeError):
        array = np.asarray([], dtype=object)
    if array.ndim != 1 or array.dtype.kind not in "fiu":
        raise InvalidMedia(f"Audio in `{param}` must be a flat list of numbers (mono samples)", param=param)
    _check_seconds(array.size / sampling_rate, max_seconds, "Audio", param)
    return _finish_audio(array.astype(np.float32), int(sampling_rate), target_rate, param)


def resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Polyphase resampling (anti-aliased), float32 in and out; a no-op when the rates match."""
    if from_rate == to_rate:
        return samples.astype(np.float32, copy=False)
    divisor = math.gcd(from_rate, to_rate)
    resampled = resample_poly(samples, to_rate // divisor, from_rate // divisor)
    return np.asarray(resampled, dtype=np.float32)


def pcm16_samples(data: bytes, *, param: str) -> np.ndarray:
    """Mono float32 in [-1, 1] from raw 16-bit little-endian PCM (no header: its rate is the caller's)."""
    if len(data) % 2:
        raise InvalidMedia(f"`{param}` is not 16-bit PCM: an odd number of bytes", param=param)
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def g711_samples(data: bytes, law: str) -> np.ndarray:
    """Mono float32 in [-1, 1] from G.711 bytes (`law`: `ulaw` or `alaw`; 8 kHz by the standard)."""
    table = _ULAW if law == "ulaw" else _ALAW
    return table[np.frombuffer(data, dtype=np.uint8)]


def _g711_tables() -> tuple[np.ndarray, np.ndarray]:
    """ITU-T G.711's expansion of every byte, µ-law and A-law, as float32 in [-1, 1]."""
    code = np.arange(256, dtype=np.int32)
    u = ~code & 0xFF
    magnitude = (((u & 0x0F) << 3) + 0x84) << ((u >> 4) & 0x07)
    ulaw = np.where(u & 0x80, 0x84 - magnitude, magnitude - 0x84)
    a = code ^ 0x55
    exponent, mantissa = (a >> 4) & 0x07, a & 0x0F
    level = np.where(
        exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0)
    )
    alaw = np.where(a & 0x80, level, -level)
    return (ulaw / 32768.0).astype(np.float32), (alaw / 32768.0).astype(np.float32)


_ULAW, _ALAW = _g711_tables()


def _read_soundfile(data: bytes, max_seconds: float, param: str) -> tuple[np.ndarray, int] | None:
    """(mono samples, rate), or None when libsndfile does not know the format."""
    try:
        with sf.SoundFile(io.BytesIO(data)) as file:
            rate = int(file.samplerate)
            _check_seconds(file.frames / rate, max_seconds, "Audio", param)
            block = file.read(dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError, ValueError, TypeError):
        return None
    return block.mean(axis=1, dtype=np.float32), rate


def _read_pyav(data: bytes, max_seconds: float, param: str) -> tuple[np.ndarray, int]:
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise InvalidMedia(f"`{param}` has no audio stream", param=param)
            stream = container.streams.audio[0]
            _check_seconds(_seconds(container, stream), max_seconds, "Audio", param)
            return _decode_audio_stream(container, stream, max_seconds, param)
    except _AV_ERRORS:
        raise InvalidMedia(
            f"`{param}` is not a readable audio file (WAV, FLAC, OGG, MP3, M4A...)", param=param
        ) from None


def _decode_audio_stream(
    container: av.container.InputContainer, stream: av.AudioStream, max_seconds: float, param: str
) -> tuple[np.ndarray, int]:
    """Mono float32 at the stream's first rate; the length is checked as it grows, since some
    containers carry no duration."""
    resampler = av.AudioResampler(format="fltp")  # planar float; layout and rate of the first frame
    chunks: list[np.ndarray] = []
    total = 0
    rate = 0
    for frame in container.decode(stream):
        for planar in resampler.resample(frame):
            rate = planar.sample_rate
            chunks.append(planar.to_ndarray().mean(axis=0, dtype=np.float32))
            total += planar.samples
            _check_seconds(total / rate, max_seconds, "Audio", param)
    for planar in resampler.resample(None):
        chunks.append(planar.to_ndarray().mean(axis=0, dtype=np.float32))
    if not chunks:
        raise InvalidMedia(f"Audio in `{param}` is empty", param=param)
    return np.concatenate(chunks), rate


def _finish_audio(mono: np.ndarray, rate: int, target_rate: int, param: str) -> np.ndarray:
    if mono.size == 0:
        raise InvalidMedia(f"Audio in `{param}` is empty", param=param)
    if not np.isfinite(mono).all():
        raise InvalidMedia(f"Audio in `{param}` contains NaN or infinite samples", param=param)
    return resample(mono, rate, target_rate)


# ---------------------------------------------------------------- video


def decode_video(
    data: bytes, *, num_frames: int, frame_sampling_rate: int, max_pixels: int, max_seconds: float, param: str
) -> list[np.ndarray]:
    """`num_frames` HxWx3 uint8 RGB frames sampled as transformers' video-classification pipeline does.

    Indices are `linspace(0, num_frames * frame_sampling_rate - 1, num_frames)`. A video shorter than
    that yields its frames up to the end and is padded by repeating the last decoded frame (the same
    array object), so models always get `num_frames` frames; transformers would fail instead.
    `num_frames` and `frame_sampling_rate` must be positive (callers validate them).
    """
    if num_frames < 1 or frame_sampling_rate < 1:
        raise ValueError("num_frames and frame_sampling_rate must be positive")
    indices = np.linspace(0, num_frames * frame_sampling_rate - 1, num=num_frames, dtype=np.int64)
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise InvalidMedia(f"`{param}` has no video stream", param=param)
            stream = container.streams.video[0]
            _check_seconds(_seconds(container, stream), max_seconds, "Video", param)
            _check_frame_size(stream.codec_context.width, stream.codec_context.height, max_pixels, param)
            frames = _sample_frames(container, stream, indices, max_pixels, max_seconds, param)
    except _AV_ERRORS:
        raise InvalidMedia(f"`{param}` is not a readable video", param=param) from None
    if not frames:
        raise InvalidMedia(f"Video in `{param}` has no decodable frames", param=param)
    return frames + [frames[-1]] * (num_frames - len(frames))


def _sample_frames(
    container: av.container.InputContainer,
    stream: av.VideoStream,
    indices: np.ndarray,
    max_pixels: int,
    max_seconds: float,
    param: str,
) -> list[np.ndarray]:
    """Decodes sequentially, keeping the frames at `indices` and stopping after the last one."""
    wanted = Counter(int(i) for i in indices)
    last = int(indices[-1])
    frames: list[np.ndarray] = []
    start: float | None = None
    for position, frame in enumerate(container.decode(stream)):
        _check_frame_size(frame.width, frame.height, max_pixels, param)
        if frame.time is not None:  # containers without a duration are bounded here
            start = frame.time if start is None else start
            _check_seconds(frame.time - start, max_seconds, "Video", param)
        if position in wanted:
            frames.extend([frame.to_ndarray(format="rgb24")] * wanted[position])
        if position >= last:
            break
    return frames


def _check_frame_size(width: int, height: int, max_pixels: int, param: str) -> None:
    if width * height > max_pixels:
        raise InvalidMedia(
            f"Video in `{param}` is too large: {width}×{height} pixels per frame (limit {max_pixels})",
            param=param,
        )


# ---------------------------------------------------------------- shared


def _seconds(container: av.container.InputContainer, stream: av.stream.Stream) -> float | None:
    """The stream's duration from the headers, else the container's; None when neither says."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * Fraction(stream.time_base))
    if container.duration is not None:
        return container.duration / av.time_base
    return None


def _check_seconds(seconds: float | None, max_seconds: float, kind: str, param: str) -> None:
    if seconds is not None and seconds > max_seconds:
        raise InvalidMedia(
            f"{kind} in `{param}` is too long: {seconds:.1f} s (limit {max_seconds:g} s)", param=param
        )


def reference_frames(
    data: bytes, *, count: int, width: int, height: int, max_pixels: int, max_seconds: float, param: str
) -> list[np.ndarray]:
    """`count` RGB frames of `width`×`height` from a reference: an image (as a still video) or a video's
    first `count` frames (its last frame repeated when it has fewer)."""

    def sized(image: Image.Image) -> np.ndarray:
        return np.asarray(image.resize((width, height), Image.Resampling.BICUBIC))

    try:
        return [sized(decode_image(data, max_pixels=max_pixels, param=param))] * count
    except InvalidMedia:
        frames = decode_video(
            data,
            num_frames=count,
            frame_sampling_rate=1,
            max_pixels=max_pixels,
            max_seconds=max_seconds,
            param=param,
        )
    return [sized(Image.fromarray(frame)) for frame in frames]
