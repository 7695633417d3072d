"""Where an import fetches an artifact's files from (`POST /v1/model-artifacts/{id}/imports`).

One `ImportSource` per scheme: `s3://bucket/prefix` (`imports.s3`), `https://…` file URLs or one
archive (`imports.https`, unpacked by `imports.archive`), `hf://org/name[@revision]` (`imports.hub`).
A source only lists and reads; the import runner (`imports.runner`) stages what it reads into a
server-side upload session, verifies each file's checksum, resumes after a restart and inspects the
result like a push.

A source's failures are `ImportFailed` with a stable `code`: the import ends `failed` with that code
and message (no secret in either), and the artifact goes back to what it was, as after a failed push.
"""

from __future__ import annotations

import fnmatch
import importlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from modelhost.config import Settings
from modelhost.errors import InvalidRequest

# The stable reasons an import fails with (`import.error.code`); the docs table lists them.
IMPORT_FAILURE_CODES = (
    "source_not_found",  # the bucket, prefix, repository, revision or URL does not exist (or is empty)
    "source_unreachable",  # connection refused, TLS failure, timeout, a 5xx after retries
    "source_denied",  # 401/403: missing or wrong credentials
    "source_too_slow",  # under the minimum rate while downloading, or a listing past its deadline
    "deadline_exceeded",  # still fetching past the import's deadline
    "address_refused",  # a non-public address (or a redirect to one) the operator did not allow
    "checksum_mismatch",  # the bytes do not hash to the stated sha256 / S3 ETag
    "unsafe_archive",  # an absolute path, `..`, a link, a device, or an expansion over the bound
    "too_large",  # more bytes or files than the server's upload limits
    "insufficient_storage",  # the free-disk floor was reached
    "interrupted",  # a resumed import found its upload session gone, or its sealed secrets unreadable
)


class ImportFailed(Exception):
    """Why a source cannot deliver; `code` is one of `IMPORT_FAILURE_CODES`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """One file a source offers.

    `path` is where it lands in the artifact (a clean relative path, `artifacts.paths`); `locator` is the
    source's own address of it (an S3 key, a URL), never shown with credentials in it. `sha256` is a
    stated checksum (the Hub's for LFS files, one given with a URL); `etag` an S3 ETag (the MD5 of a
    single-part object, `<md5 of part md5s>-<parts>` of a multipart one). `archive`: the file is a
    `.tar`, `.tar.gz` or `.zip` to unpack into the artifact (`imports.archive`) rather than keep."""

    path: str
    locator: str
    size: int | None = None
    sha256: str | None = None
    etag: str | None = None
    archive: bool = False


class ImportSource(Protocol):
    """What an import needs of a source. Both methods run on the server's event loop; blocking clients
    (boto3, huggingface_hub) run in a thread inside them."""

    @property
    def description(self) -> str:
        """The source as the import shows it (`s3://bucket/prefix`, `hf://org/name@rev`): no secret."""
        ...

    async def list_files(self) -> list[RemoteFile]:
        """The files to fetch, after the import's include / exclude patterns; ImportFailed if none."""
        ...

    def read(self, file: RemoteFile, offset: int = 0) -> AsyncIterator[bytes]:
        """The file's bytes from `offset` on (a resumed fetch asks for the rest); ImportFailed on any
        failure. Every network hop goes through the outbound client (`modelhost.outbound`): public
        addresses only unless the operator allows more networks."""
        ...


def selected(path: str, include: Sequence[str] | None, exclude: Sequence[str] | None) -> bool:
    """Whether an artifact path is imported: it matches an `include` pattern (all do when none is given)
    and no `exclude` pattern. Patterns are `fnmatch`'s on the whole path, where `*` also crosses `/`
    (`*.bin` is every `.bin` file in every folder)."""
    if include and not any(fnmatch.fnmatchcase(path, pattern) for pattern in include):
        return False
    return not (exclude and any(fnmatch.fnmatchcase(path, pattern) for pattern in exclude))


# scheme → the module and class that read it, imported when first asked for (boto3 and huggingface_hub
# load only where an import needs them)
SCHEMES = {
    "s3": ("modelhost.imports.s3", "S3Source"),
    "https": ("modelhost.imports.https", "HttpsSource"),
    "hf": ("modelhost.imports.hub", "HubSource"),
}


def source_of(
    source: str | list[Any],
    include: list[str] | None,
    exclude: list[str] | None,
    credentials: dict[str, Any] | None,
    settings: Settings,
) -> ImportSource:
    """The source an import's `source` names: `s3://bucket/prefix`, `hf://org/name[@revision]`, an
    `https://` URL, or a list of https files (URLs or `{url, path?, sha256?}`). Each class is built as
    `Class(source, include=…, exclude=…, credentials=…, settings=…)` (a list given as it is) and checks
    the source's form and its credentials' shape there, without a network call: a malformed one is
    InvalidRequest (400)."""
    first = source[0] if isinstance(source, list) and source else source
    url = first.get("url") if isinstance(first, dict) else first
    if not isinstance(url, str) or "://" not in url:
        raise _unsupported()
    scheme = url.split("://", 1)[0].lower()
    if isinstance(source, list) and scheme != "https":
        raise InvalidRequest(
            "A list of sources must be https:// files.", param="source", code="invalid_source"
        )
    if scheme not in SCHEMES:
        raise _unsupported()
    module_name, class_name = SCHEMES[scheme]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise _unsupported() from None
    built: ImportSource = getattr(module, class_name)(
        source, include=include, exclude=exclude, credentials=credentials, settings=settings
    )
    return built


def _unsupported() -> InvalidRequest:
    return InvalidRequest(
        "Unsupported source: give s3://bucket/prefix, hf://org/name[@revision], an https:// URL or a "
        "list of them.",
        param="source",
        code="invalid_source",
    )
