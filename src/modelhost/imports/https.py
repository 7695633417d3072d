"""Importing from https URLs: one archive, or a list of files (there is no such thing as a folder
listing over HTTP).

`source` is one URL: an archive (`.tar`, `.tar.gz` / `.tgz`, `.zip`; unpacked by `imports.archive`)
or a single file; or a list whose entries are a URL or `{"url", "path"?, "sha256"?}`: each file lands
at `path` (default: the URL path's last segment). A stated sha256 travels in `RemoteFile.sha256` and
the runner checks the bytes against it. Only https: model weights over cleartext could be swapped on
the way. Credentials (`{"bearer_token"}`, or `{"headers": {...}}`) go to each URL's own host only,
never after a redirect to another one (a CDN, a signed storage URL).
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx

from modelhost.artifacts.paths import clean_upload_path
from modelhost.config import Settings
from modelhost.errors import InvalidRequest
from modelhost.imports.remote import import_bounds, open_remote, retried, stream
from modelhost.imports.sources import ImportFailed, RemoteFile, selected

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_LISTING_CONCURRENCY = 8


@dataclass(frozen=True)
class HttpsEntry:
    """One URL to fetch and where its file lands; `archive`: unpack it rather than keep it."""

    url: str
    path: str
    sha256: str | None = None
    archive: bool = False


def parse_https_source(source: str | list[Any]) -> list[HttpsEntry]:
    """The entries of an import's `source`: one URL (an archive when its path ends with one of
    `ARCHIVE_SUFFIXES`, else a file), or a list of files; InvalidRequest (400, `param` naming the entry)
    for anything malformed, an http URL, or two files at one path."""
    if isinstance(source, str):
        entry = _parse_entry(source, "source")
        archive = urlsplit(entry.url).path.lower().endswith(ARCHIVE_SUFFIXES)
        return [HttpsEntry(entry.url, entry.path, archive=archive)]
    if not isinstance(source, list) or not source:
        raise InvalidRequest("`source` must be an https URL or a non-empty list of them.", param="source")
    entries = [_parse_entry(item, f"source[{i}]") for i, item in enumerate(source)]
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if entry.path in seen:
            raise InvalidRequest(
                f"Two files would land at {entry.path!r} (source[{seen[entry.path]}] and source[{i}]): "
                "give one of them a `path`.",
                param=f"source[{i}].path",
            )
        seen[entry.path] = i
    return entries


def https_headers(credentials: Mapping[str, Any] | None) -> dict[str, str]:
    """The request headers an import's `credentials` give: `{"bearer_token": t}` → `Authorization:
    Bearer t`, `{"headers": {name: value}}` as they are. InvalidRequest for anything else."""
    if not credentials:
        return {}
    unknown = set(credentials) - {"bearer_token", "headers"}
    if unknown:
        raise InvalidRequest(
            f"Unknown credentials for https: {sorted(unknown)} (give `bearer_token` or `headers`).",
            param="credentials",
        )
    headers: dict[str, str] = {}
    token = credentials.get("bearer_token")
    if token is not None:
        if not isinstance(token, str) or not token or not token.isprintable():
            raise InvalidRequest(
                "`credentials.bearer_token` must be a non-empty string.", param="credentials.bearer_token"
            )
        headers["Authorization"] = f"Bearer {token}"
    given = credentials.get("headers") or {}
    if not isinstance(given, dict) or not all(
        isinstance(k, str) and _HEADER_NAME.fullmatch(k) and isinstance(v, str) and v.isprintable()
        for k, v in given.items()
    ):
        raise InvalidRequest(
            "`credentials.headers` must map header names to printable strings.", param="credentials.headers"
        )
    return {**given, **headers}


class HttpsSource:
    """Files (or one archive) at https URLs, fetched by the outbound client (`imports.remote`).

    Built as every source is (`Class(source, include=…, exclude=…, credentials=…, settings=…)`), the
    source's form and the credentials' shape checked here, without a network call. `include` /
    `exclude` choose among a list's files by their paths; an archive's members are chosen when it is
    unpacked."""

    def __init__(
        self,
        source: str | list[Any],
        *,
        include: list[str] | None = None,
        exclude: list[str] | None = None,
        credentials: Mapping[str, Any] | None = None,
        settings: Settings,
    ) -> None:
        self._entries = parse_https_source(source)
        self._include, self._exclude = include, exclude
        self._headers = https_headers(credentials)
        self._bounds = import_bounds(settings)
        self._most = settings.max_upload_files

    @property
    def description(self) -> str:
        first = httpx.URL(self._entries[0].url).copy_with(query=None, fragment=None)
        more = len(self._entries) - 1
        return str(first) if not more else f"{first} and {more} more"

    async def list_files(self) -> list[RemoteFile]:
        """Each chosen entry as a RemoteFile, its size from the answer's headers. Each URL is opened
        (and closed before its body) rather than asked with HEAD: a signed storage URL is signed for
        GET only. A URL that does not answer fails the import now rather than after the others' bytes."""
        chosen = [e for e in self._entries if e.archive or selected(e.path, self._include, self._exclude)]
        if not chosen:
            raise ImportFailed("source_not_found", "No file of the list matches `include` / `exclude`.")
        if len(chosen) > self._most:  # told before a URL is probed
            raise ImportFailed(
                "too_large", f"The source has {len(chosen)} files; an artifact holds at most {self._most}."
            )
        limit = asyncio.Semaphore(_LISTING_CONCURRENCY)

        async def probe(entry: HttpsEntry) -> RemoteFile:
            async with (
                limit,
                open_remote(entry.url, self._bounds, what=entry.path, headers=self._headers) as answer,
            ):
                size = answer.size
            return RemoteFile(entry.path, entry.url, size=size, sha256=entry.sha256, archive=entry.archive)

        return list(await asyncio.gather(*(retried(functools.partial(probe, entry)) for entry in chosen)))

    def read(self, file: RemoteFile, offset: int = 0) -> AsyncIterator[bytes]:
        return stream(file.locator, self._bounds, what=file.path, headers=self._headers, offset=offset)


def _parse_entry(item: Any, param: str) -> HttpsEntry:
    url_param = param if isinstance(item, str) else f"{param}.url"
    if isinstance(item, str):
        item = {"url": item}
    if not isinstance(item, dict) or not isinstance(item.get("url"), str):
        raise InvalidRequest("Each entry is an https URL or an object with `url`.", param=param)
    unknown = set(item) - {"url", "path", "sha256"}
    if unknown:
        raise InvalidRequest(f"Unknown fields {sorted(unknown)} (give `url`, `path`, `sha256`).", param=param)
    url = _parse_url(item["url"], url_param)
    path = item.get("path", _last_segment(url))
    if not isinstance(path, str):
        raise InvalidRequest("`path` must be a string.", param=f"{param}.path")
    if not path:
        raise InvalidRequest("The URL does not end with a file name: give a `path`.", param=f"{param}.path")
    try:
        clean_upload_path(path)
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message, param=f"{param}.path", code=exc.code) from None
    sha256 = item.get("sha256")
    if sha256 is not None and (not isinstance(sha256, str) or not _SHA256.fullmatch(sha256.lower())):
        raise InvalidRequest("`sha256` must be 64 hexadecimal digits.", param=f"{param}.sha256")
    return HttpsEntry(str(url), path, sha256.lower() if sha256 else None)


def _parse_url(value: str, param: str) -> httpx.URL:
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL as exc:
        raise InvalidRequest(f"Not a valid URL: {exc}", param=param) from None
    if url.scheme != "https" or not url.host:
        raise InvalidRequest(
            "Only https URLs are imported (model weights over plain http could be altered on the way).",
            param=param,
        )
    if url.userinfo:
        raise InvalidRequest(
            "Put credentials in `credentials`, not in the URL (URLs are shown back).", param=param
        )
    return url


def _last_segment(url: httpx.URL) -> str:
    return unquote(url.path.rsplit("/", 1)[-1])
