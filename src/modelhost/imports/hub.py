"""Importing `hf://org/name[@revision]` from a Hugging Face Hub (or a Hub-compatible server: HF_ENDPOINT).

The revision (default `main`) is resolved to a commit once, by the listing, and every file is read
from that commit, so a push to the repository during the import cannot mix two versions. The listing
is the Hub's model-info route with file metadata (`api/models/{repo}/revision/{rev}?blobs=true`),
parsed by huggingface_hub's `ModelInfo`; each file comes from its `resolve` route, following the
Hub's redirect to its CDN. Both go through this server's outbound client (`imports.remote`) rather than
huggingface_hub's HTTP client: that client is one per process, follows redirects and resolves names
by itself (no hop would be vetted, no answer bounded) and refuses every call while
HF_HUB_OFFLINE is set, as it is for the replicas. The token goes to the endpoint's host only, never to
the CDN a redirect names.

By default only what inspection needs is fetched: the safetensors weights, configs, tokenizers and
chat templates (`DEFAULT_FILES`), not the same weights in other formats (`OTHER_FORMATS`); `include`
replaces that choice, `exclude` removes from it (shell patterns over the whole path, as
huggingface_hub's `allow_patterns`: `*` crosses `/`).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import quote

import huggingface_hub
from huggingface_hub.errors import HFValidationError
from huggingface_hub.hf_api import ModelInfo
from huggingface_hub.utils._validators import validate_repo_id

from modelhost.config import Settings
from modelhost.errors import InvalidRequest
from modelhost.imports.remote import (
    HTTPS_ONLY,
    import_bounds,
    import_failure,
    listing_bounds,
    retried,
    stream,
)
from modelhost.imports.sources import ImportFailed, RemoteFile
from modelhost.outbound import FetchFailed, fetch_url

SCHEME = "hf://"
# What inspection needs, by file name: weights in safetensors, configs (and shard indexes),
# tokenizers (vocabularies, merges, sentencepiece and tiktoken models) and chat templates.
DEFAULT_FILES = ("*.safetensors", "*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja")
# Other formats' copies of the same weights, and their indexes and configs: by file name ...
OTHER_FORMATS = (
    "pytorch_model*",
    "tf_*",
    "flax_*",
    "*.msgpack*",
    "*.h5",
    "*.ot",
    "*.onnx*",
    "*.gguf",
    "*.bin",
)
# ... and by folder (ONNX and OpenVINO exports, Meta's original checkpoints beside the converted ones).
OTHER_FORMAT_FOLDERS = frozenset({"onnx", "openvino", "original"})
_LISTING_MAX_BYTES = 64 * 1024**2
_COMMIT = re.compile(r"[0-9a-f]{40}")


def parse_hub_source(source: str) -> tuple[str, str]:
    """(repository id, revision) of `hf://org/name[@revision]`, the revision `main` when not given;
    InvalidRequest (400) for anything else."""
    if not source.startswith(SCHEME):
        raise InvalidRequest("A Hub source is `hf://org/name[@revision]`.", param="source")
    repo_id, _, revision = source.removeprefix(SCHEME).partition("@")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise InvalidRequest(f"Not a Hub repository id: {exc}", param="source") from None
    if "@" in revision or (revision == "" and source.endswith("@")) or not revision.isprintable():
        raise InvalidRequest("The revision after `@` must be a branch, tag or commit.", param="source")
    return repo_id, revision or "main"


def select_files(names: Iterable[str], include: list[str] | None, exclude: list[str] | None) -> list[str]:
    """The repository files an import fetches: `include`'s matches (by default `DEFAULT_FILES` outside
    `OTHER_FORMATS`), less `exclude`'s. A safetensors variant (`x.fp16.safetensors`) beside its plain
    file (`x.safetensors`) is left out by default too."""
    names = list(names)
    if include is not None:
        chosen = [n for n in names if _matches(n, include)]
    else:
        chosen = [n for n in names if _is_default(n)]
        plain = set(chosen)
        chosen = [n for n in chosen if not _is_variant_of(n, plain)]
    return [n for n in chosen if not _matches(n, exclude or [])]


class HubSource:
    """A Hub repository at one commit (`hf://org/name@revision`)."""

    def __init__(
        self,
        source: str | list[Any],
        *,
        include: list[str] | None = None,
        exclude: list[str] | None = None,
        credentials: Mapping[str, Any] | None = None,
        settings: Settings,
    ) -> None:
        """Built as every source is; `credentials` `{"token"}`, else none: the server's own token
        (`HF_TOKEN`, or `hf auth login`'s) reads what no account may have, so it is sent only for the
        repositories the operator lent it to (MODELHOST_IMPORT_HUB_OPERATOR_TOKEN_REPOS). The endpoint is
        `HF_ENDPOINT`, else huggingface.co."""
        if not isinstance(source, str):
            raise InvalidRequest("A Hub source is one `hf://org/name[@revision]`.", param="source")
        self._repo_id, self._revision = parse_hub_source(source)
        self._bounds = import_bounds(settings)
        self._listing_bounds = listing_bounds(settings, _LISTING_MAX_BYTES)
        self._include = include
        self._exclude = exclude
        self._endpoint = (os.environ.get("HF_ENDPOINT") or huggingface_hub.constants.ENDPOINT).rstrip("/")
        token = _token(credentials) or _operator_token(self._repo_id, settings)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        # An operator's mirror may be plain http on its own network; the files still must be https unless
        # the mirror itself serves them.
        self._schemes = ("http", "https") if self._endpoint.startswith("http://") else HTTPS_ONLY

    @property
    def description(self) -> str:
        return f"{SCHEME}{self._repo_id}@{self._revision}"

    async def list_files(self) -> list[RemoteFile]:
        """The selected files of the revision's commit, with the Hub's sizes and (LFS) sha256."""
        info = await retried(self._model_info)
        commit = info.sha if info.sha and _COMMIT.fullmatch(info.sha) else self._revision
        sizes = {
            s.rfilename: (s.lfs.size if s.lfs else s.size, s.lfs.sha256 if s.lfs else None)
            for s in info.siblings or []
        }
        chosen = select_files(sizes, self._include, self._exclude)
        default = chosen if self._include is None and not self._exclude else select_files(sizes, None, None)
        if self._include is None and not any(name.endswith(".safetensors") for name in default):
            raise ImportFailed("source_not_found", self._no_safetensors(sizes))
        if not chosen:
            raise ImportFailed(
                "source_not_found", f"No file of {self.description} matches `include` / `exclude`."
            )
        return [
            RemoteFile(name, self._resolve_url(commit, name), size=sizes[name][0], sha256=sizes[name][1])
            for name in chosen
        ]

    def read(self, file: RemoteFile, offset: int = 0) -> AsyncIterator[bytes]:
        return stream(
            file.locator,
            self._bounds,
            what=file.path,
            headers=self._headers,
            offset=offset,
            schemes=self._schemes,
        )

    async def _model_info(self) -> ModelInfo:
        revision = quote(self._revision, safe="")
        url = f"{self._endpoint}/api/models/{self._repo_id}/revision/{revision}?blobs=true"
        what = self.description
        try:
            body = await fetch_url(
                url,
                self._listing_bounds,
                timeout=None,
                param=what,
                headers=self._headers,
                schemes=self._schemes,
            )
        except FetchFailed as exc:
            raise self._listing_failure(exc) from None
        try:
            return ModelInfo(**json.loads(body))  # type: ignore[no-untyped-call]
        except (ValueError, TypeError, KeyError) as exc:
            raise ImportFailed(
                "source_unreachable",
                f"{self._endpoint} did not answer like a Hub ({type(exc).__name__}: {exc})",
            ) from None

    def _listing_failure(self, exc: FetchFailed) -> ImportFailed:
        """The Hub's own reason (its `X-Error-Code`) where it gave one: the Hub answers 401 for a
        missing repository to a caller without a token, as for a private one."""
        failure = import_failure(exc)
        reason = exc.answer_headers.get("x-error-code") if exc.answer_headers is not None else None
        if reason == "GatedRepo":
            return ImportFailed(
                "source_denied",
                f"{self.description} is gated: accept its conditions on the Hub with the token's account "
                "(credentials.token), then import again.",
            )
        if reason == "RevisionNotFound":
            return ImportFailed("source_not_found", f"{self.description}: no such revision.")
        if reason == "RepoNotFound" or failure.code in ("source_not_found", "source_denied"):
            return ImportFailed(
                "source_not_found" if reason == "RepoNotFound" else failure.code,
                f"{self.description}: no such repository, or it is private and no token given "
                "(credentials.token) grants access.",
            )
        return failure

    def _resolve_url(self, commit: str, path: str) -> str:
        return f"{self._endpoint}/{self._repo_id}/resolve/{commit}/{quote(path)}"

    def _no_safetensors(self, files: Iterable[str]) -> str:
        kinds = sorted({posixpath.splitext(name)[1] for name in files if _is_other_format(name)})
        offered = f" (it offers {', '.join(k for k in kinds if k)})" if kinds else ""
        return (
            f"{self.description} has no safetensors weights{offered}. Ask for other files with `include`, "
            'e.g. ["*.gguf"] for one GGUF file (name it: a repository often holds many); pickle-based '
            "weights (.bin, .pt) are refused at inspection unless the operator allows them "
            "(MODELHOST_ALLOW_PICKLE_WEIGHTS)."
        )


def _token(credentials: Mapping[str, Any] | None) -> str | None:
    if not credentials:
        return None
    token = credentials.get("token")
    if set(credentials) != {"token"} or not isinstance(token, str) or not token or not token.isprintable():
        raise InvalidRequest('Hub credentials are `{"token": "hf_…"}`.', param="credentials")
    return token


def _operator_token(repo_id: str, settings: Settings) -> str | None:
    """The server's token, for a repository the operator lent it to; else None."""
    lent = any(fnmatchcase(repo_id.lower(), p.lower()) for p in settings.hub_operator_token_repos)
    return huggingface_hub.get_token() if lent else None


def _matches(name: str, patterns: Iterable[str]) -> bool:
    """Shell patterns over the whole path, as huggingface_hub's `allow_patterns` match."""
    return any(fnmatchcase(name, p) for p in patterns)


def _is_default(name: str) -> bool:
    base = posixpath.basename(name)
    return any(fnmatchcase(base, p) for p in DEFAULT_FILES) and not _is_other_format(name)


def _is_other_format(name: str) -> bool:
    folders = name.split("/")[:-1]
    base = posixpath.basename(name)
    return bool(OTHER_FORMAT_FOLDERS.intersection(folders)) or any(
        fnmatchcase(base, p) for p in OTHER_FORMATS
    )


def _is_variant_of(name: str, names: set[str]) -> bool:
    """`unet/x.fp16.safetensors` when `unet/x.safetensors` is there too (diffusers' variants)."""
    stem, dot, _variant = name.removesuffix(".safetensors").rpartition(".")
    return name.endswith(".safetensors") and bool(dot) and f"{stem}.safetensors" in names
