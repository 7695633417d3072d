"""Validation of the relative file paths clients upload into an artifact."""

from __future__ import annotations

import unicodedata

from modelhost.errors import InvalidRequest

MAX_PATH_LENGTH = 512
MAX_SEGMENT_LENGTH = 255
MAX_DEPTH = 16


def clean_upload_path(path: str) -> str:
    """Return `path` if it is a safe relative POSIX path inside an artifact, else raise 400.

    Refused: empty, absolute, `.`/`..` segments, empty segments, backslashes, NUL or any control
    character, over-long names, and reserved names used by the staging area.
    """

    def refuse(reason: str) -> InvalidRequest:
        return InvalidRequest(f"Invalid file path: {reason}.", param="path", code="invalid_path")

    if not path:
        raise refuse("empty")
    if len(path) > MAX_PATH_LENGTH:
        raise refuse(f"longer than {MAX_PATH_LENGTH} characters")
    if "\\" in path:
        raise refuse("backslashes are not allowed; use '/'")
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn") for ch in path):
        raise refuse("control or unassigned characters are not allowed")
    if path.startswith("/"):
        raise refuse("must be relative")
    segments = path.split("/")
    if len(segments) > MAX_DEPTH:
        raise refuse(f"deeper than {MAX_DEPTH} folders")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise refuse("empty, '.' and '..' segments are not allowed")
        if len(segment.encode("utf-8")) > MAX_SEGMENT_LENGTH:
            raise refuse(f"a name is longer than {MAX_SEGMENT_LENGTH} bytes")
        if segment.startswith(".modelhost"):
            raise refuse("names starting with '.modelhost' are reserved")
        if segment != segment.strip():
            raise refuse("names may not start or end with white space")
    return path
