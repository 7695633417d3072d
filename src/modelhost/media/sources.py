"""Turning a media reference from a request into bytes: base64, data URI, http(s) URL or local path.

This is the only place the gateway reads media, so the rules are the same for every endpoint: the
size limit applies before decoding base64 or reading a file, URLs go through the outbound client
(`modelhost.outbound`: addresses vetted, bytes and time bounded), and local paths (video inputs only)
are confined to the operator's media root.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from modelhost.config import Settings
from modelhost.errors import InvalidMedia
from modelhost.outbound import Bounds, fetch_url, parse_networks

# Suffixes that make a scheme-less value a path rather than base64 (base64 never contains ".").
MEDIA_SUFFIXES = frozenset(
    {".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ogv", ".gif", ".flv", ".wmv"}
    | {".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".m4a", ".aac"}
    | {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff"}
)
PATH_MAX = 4096  # longer values are payloads, not paths
# ISO base media (MP4, MOV, HEIF) major brands that say more than "audio or video".
_IMAGE_BRANDS = frozenset({b"avif", b"avis", b"heic", b"heix", b"heim", b"heis", b"mif1", b"msf1"})
_AUDIO_BRANDS = frozenset({b"M4A ", b"M4B ", b"M4P ", b"F4A "})
_BMP_HEADERS = frozenset({12, 40, 52, 56, 64, 108, 124})  # sizes of the BMP info headers
IMAGE, AUDIO, VIDEO = "image", "audio", "video"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_DATA_URI = re.compile(r"^data:(?P<mime>[^,]*?)(?P<base64>;base64)?,", re.IGNORECASE)
_WHITESPACE = str.maketrans("", "", " \t\r\n\f\v")


@dataclass(frozen=True)
class MediaPolicy:
    """Limits for reading media references; built once from the settings (`Services.media`)."""

    fetch: Bounds
    media_root: Path | None
    max_bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> MediaPolicy:
        return cls(
            fetch=media_bounds(settings),
            media_root=settings.media_root,
            max_bytes=settings.media_max_bytes,
        )


def media_bounds(settings: Settings) -> Bounds:
    """The bounds of one media URL's fetch: the media size limit, one deadline for the whole fetch (a
    media input is small: a slow trickle is as bad as silence), the redirects allowed."""
    return Bounds(
        networks=parse_networks(settings.media_allow_networks),
        max_bytes=settings.media_max_bytes,
        seconds=settings.media_fetch_timeout_seconds,
        idle_seconds=settings.media_fetch_timeout_seconds,
        requests=settings.media_max_redirects + 1,
    )


async def load_media(
    value: str, policy: MediaPolicy, *, param: str, timeout: float | None, allow_paths: bool = False
) -> bytes:
    """The bytes `value` refers to, or InvalidMedia naming `param` (the request field).

    `allow_paths` is for video inputs, which follow the transformers pipeline in accepting file paths;
    such paths are read only below MODELHOST_MEDIA_ROOT.
    """
    text = value.strip()
    if not text:
        raise InvalidMedia(f"`{param}` is empty", param=param)
    scheme = _SCHEME.match(text)
    if scheme is None:
        if allow_paths and _looks_like_path(text):
            return await asyncio.to_thread(read_local, text, policy, param=param)
        return decode_base64(text, param=param, max_bytes=policy.max_bytes)
    name = scheme.group(1).lower()
    if name == "data":
        return _decode_data_uri(text, param=param, max_bytes=policy.max_bytes)
    if name in ("http", "https"):
        return await fetch_url(text, policy.fetch, timeout=timeout, param=param)
    raise InvalidMedia(
        f"Unsupported scheme {name!r} in `{param}`: send base64, a data URI or an http(s) URL", param=param
    )


def media_kinds(data: bytes) -> frozenset[str]:
    """What a file's first bytes say it is: `image`, `audio`, `video`, both of the last two for the
    containers that hold either (MP4, WebM/Matroska, Ogg), or nothing for unknown bytes. No JSON text
    starts like any of these files, so a body can be told apart from JSON by this alone."""
    head, riff = data[:16], data[8:12] if data[:4] == b"RIFF" else b""
    if head.startswith((b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"II*\x00", b"MM\x00*")):
        return frozenset({IMAGE})
    if riff == b"WEBP" or (head[:2] == b"BM" and int.from_bytes(data[14:18], "little") in _BMP_HEADERS):
        return frozenset({IMAGE})
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in _IMAGE_BRANDS:
            return frozenset({IMAGE})
        return frozenset({AUDIO}) if brand in _AUDIO_BRANDS else frozenset({AUDIO, VIDEO})
    if riff == b"WAVE" or head.startswith((b"fLaC", b"ID3", b"#!AMR", b"caff")):
        return frozenset({AUDIO})
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return frozenset({AUDIO})
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:  # MPEG audio / ADTS frame sync
        return frozenset({AUDIO})
    if head.startswith((b"OggS", b"\x1a\x45\xdf\xa3")):
        return frozenset({AUDIO, VIDEO})
    if riff == b"AVI " or head.startswith((b"\x00\x00\x01\xba", b"FLV")):
        return frozenset({VIDEO})
    return frozenset()


def _looks_like_path(text: str) -> bool:
    # JPEG base64 starts with "/9j/", so a leading "/" alone would misread payloads: paths are short.
    if len(text) > PATH_MAX or "\n" in text:
        return False
    return text.startswith(("/", "./", "../")) or Path(text).suffix.lower() in MEDIA_SUFFIXES


def _decode_data_uri(text: str, *, param: str, max_bytes: int) -> bytes:
    match = _DATA_URI.match(text)
    if match is None or match.group("base64") is None:
        raise InvalidMedia(
            f"`{param}` is not a base64 data URI (expected data:<mime type>;base64,<payload>)", param=param
        )
    return decode_base64(text[match.end() :], param=param, max_bytes=max_bytes)


def decode_base64(value: str, *, param: str, max_bytes: int) -> bytes:
    """Strict standard base64 (padding required, whitespace ignored), refused before decoding if
    the result would pass `max_bytes`, so an oversized payload costs no decoding work."""
    # Whitespace cannot more than double a payload (one newline per 76 characters is usual).
    if len(value) > 2 * _encoded_length(max_bytes):
        raise _too_large(param, max_bytes)
    compact = value.translate(_WHITESPACE)
    if not compact:
        raise InvalidMedia(f"`{param}` is empty", param=param)
    if len(compact) // 4 * 3 - compact[-2:].count("=") > max_bytes:
        raise _too_large(param, max_bytes)
    try:
        return base64.b64decode(compact.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise InvalidMedia(
            f"`{param}` is not valid base64 (nor a data URI or an http(s) URL)", param=param
        ) from None


def _encoded_length(size: int) -> int:
    return (size + 2) // 3 * 4


def _too_large(param: str, max_bytes: int) -> InvalidMedia:
    return InvalidMedia(f"Media in `{param}` is too large (limit {max_bytes} bytes)", param=param)


def read_local(path: str, policy: MediaPolicy, *, param: str) -> bytes:
    """A regular file below the media root; relative paths are relative to the root.

    The resolved path (symlinks followed) must stay inside the resolved root, so neither `..` nor a
    symlink can lead out of it. Opening with O_NOFOLLOW and checking the open file closes the gap
    of the last component being swapped for a symlink after the check.
    """
    if policy.media_root is None:
        raise InvalidMedia(
            f"`{param}`: local paths are disabled: the operator has not set MODELHOST_MEDIA_ROOT", param=param
        )
    try:
        root = os.path.realpath(policy.media_root)
        resolved = os.path.realpath(os.path.join(root, path))
        inside = os.path.commonpath([root, resolved]) == root
    except ValueError:  # NUL bytes and the like
        raise InvalidMedia(f"`{param}` is not a valid path", param=param) from None
    if not inside:
        raise InvalidMedia(f"`{param}`: the path is outside the media root", param=param)
    return _read_regular_file(resolved, policy.max_bytes, param=param)


def _read_regular_file(path: str, max_bytes: int, *, param: str) -> bytes:
    try:
        # O_NONBLOCK: opening a FIFO must not hang the thread; regular files ignore the flag.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InvalidMedia(f"`{param}`: no such file under the media root", param=param) from None
    except OSError as exc:
        raise InvalidMedia(f"`{param}`: the file cannot be read ({exc.strerror})", param=param) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidMedia(f"`{param}` is not a regular file", param=param)
        if info.st_size > max_bytes:
            raise _too_large(param, max_bytes)
        data = _read_fd(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # the file grew since fstat
        raise _too_large(param, max_bytes)
    return data


def _read_fd(fd: int, limit: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < limit:
        chunk = os.read(fd, min(limit - len(chunks), 1 << 20))
        if not chunk:
            break
        chunks += chunk
    return bytes(chunks)
