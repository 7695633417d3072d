"""The one place generated media is encoded: images (PNG, JPEG, WebP), audio (MP3, Opus, AAC, FLAC,
WAV, PCM), video (MP4, H.264) and a video's previews (a WebP thumbnail, a JPEG spritesheet), in-process
with Pillow and PyAV (no `ffmpeg` program needed).

Used inside worker processes, next to the model that produced the pixels or samples.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import Any

import av
import numpy as np

from modelhost.media.decode import resample

IMAGE_FORMATS = {"png": ("PNG", "image/png"), "jpeg": ("JPEG", "image/jpeg"), "webp": ("WEBP", "image/webp")}
# response_format → (container, codec, content type); `pcm` is raw little-endian 16-bit samples.
AUDIO_FORMATS = {
    "mp3": ("mp3", "libmp3lame", "audio/mpeg"),
    "opus": ("ogg", "libopus", "audio/ogg"),
    "aac": ("adts", "aac", "audio/aac"),
    "flac": ("flac", "flac", "audio/flac"),
    "wav": ("wav", "pcm_s16le", "audio/wav"),
    "pcm": ("", "", "audio/pcm"),
}
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
# A video's spritesheet: up to SPRITE_FRAMES frames spread over the video (first and last included),
# SPRITE_COLUMNS to a row, each scaled so that its longer side is at most SPRITE_TILE pixels.
SPRITE_FRAMES = 16
SPRITE_COLUMNS = 4
SPRITE_TILE = 160


def encode_image(image: Any, fmt: str, quality: int = 90) -> bytes:
    """A PIL image as PNG, JPEG or WebP bytes (JPEG has no alpha: converted to RGB)."""
    name, _ = IMAGE_FORMATS[fmt]
    if fmt == "jpeg" and image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    buffer = io.BytesIO()
    options = {"quality": quality} if fmt in ("jpeg", "webp") else {}
    image.save(buffer, format=name, **options)
    return buffer.getvalue()


def encode_audio(samples: np.ndarray, rate: int, fmt: str) -> bytes:
    """Mono float samples in [-1, 1] at `rate` Hz as a file of `fmt` (see AUDIO_FORMATS)."""
    mono = np.asarray(samples, dtype=np.float32).reshape(-1)
    if fmt == "opus" and rate not in OPUS_RATES:  # Opus runs at a few fixed rates only
        mono, rate = resample(mono, rate, 48000), 48000
    pcm16 = (np.clip(mono, -1.0, 1.0) * 32767).astype("<i2")
    if fmt == "pcm":
        return pcm16.tobytes()
    container_format, codec, _ = AUDIO_FORMATS[fmt]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container_format) as container:
        stream: Any = container.add_stream(codec, rate=rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(pcm16.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        frame.pts, frame.time_base = 0, Fraction(1, rate)
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def encode_g711(samples: np.ndarray, law: str) -> bytes:
    """Mono float samples in [-1, 1] (already at 8 kHz) as G.711 bytes (`law`: `ulaw` or `alaw`)."""
    pcm = (np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0) * 32767).astype(np.int32)
    negative = pcm < 0
    if law == "ulaw":
        biased = np.minimum(np.abs(pcm), 32635) + 0x84
        exponent = np.clip(np.floor(np.log2(biased)).astype(np.int32) - 7, 0, 7)
        mantissa = (biased >> (exponent + 3)) & 0x0F
        code = (negative.astype(np.int32) << 7) | (exponent << 4) | mantissa
        return bytes((~code & 0xFF).astype(np.uint8).tobytes())
    magnitude = np.minimum(np.abs(pcm), 32767)
    exponent = np.clip(np.floor(np.log2(np.maximum(magnitude, 1))).astype(np.int32) - 7, 0, 7)
    mantissa = np.where(exponent == 0, magnitude >> 4, magnitude >> (exponent + 3)) & 0x0F
    code = (np.where(negative, 0, 0x80) | (exponent << 4) | mantissa) ^ 0x55
    return bytes(code.astype(np.uint8).tobytes())


def encode_mp4(frames: np.ndarray, fps: int) -> bytes:
    """Frames `[count, height, width, 3]` (uint8 RGB) as an H.264 MP4 at `fps` frames per second.

    H.264 with yuv420p needs even sides: odd ones are padded by one row or column (edge pixels)."""
    count, height, width, _ = frames.shape
    even = np.pad(frames, ((0, 0), (0, height % 2), (0, width % 2), (0, 0)), mode="edge")
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream: Any = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = even.shape[2], even.shape[1], "yuv420p"
        stream.options = {"preset": "veryfast", "crf": "20"}
        for index in range(count):
            frame = av.VideoFrame.from_ndarray(even[index], format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def encode_thumbnail(frames: np.ndarray) -> bytes:
    """The first frame of `[count, height, width, 3]` uint8 RGB frames as a WebP of the video's size:
    the frame a player shows before playing, so the thumbnail matches what the viewer sees first."""
    from PIL import Image

    return encode_image(Image.fromarray(frames[0]), "webp")


def encode_spritesheet(frames: np.ndarray) -> bytes:
    """A JPEG grid of frames spread evenly over the video, in order, row by row (see SPRITE_*)."""
    from PIL import Image

    count, height, width, _ = frames.shape
    picked = np.unique(np.linspace(0, count - 1, min(count, SPRITE_FRAMES)).round().astype(int))
    scale = min(1.0, SPRITE_TILE / max(width, height))
    tile = (max(1, round(width * scale)), max(1, round(height * scale)))
    columns = min(len(picked), SPRITE_COLUMNS)
    rows = -(-len(picked) // columns)
    sheet = Image.new("RGB", (tile[0] * columns, tile[1] * rows))
    for place, index in enumerate(picked):
        image = Image.fromarray(frames[index]).resize(tile, Image.Resampling.LANCZOS)
        sheet.paste(image, ((place % columns) * tile[0], (place // columns) * tile[1]))
    return encode_image(sheet, "jpeg")
