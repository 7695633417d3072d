"""Imports (issue 52): an artifact filled by the server from S3 (moto's server), verified, resumable,
cancellable, then inspected as a push is.

The runner's logic is tested without a server, against a source that serves a tiny model's folder and
counts what it reads; the routes through the app; S3 and the CLI against a live server and moto.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from typer.testing import CliRunner

from modelhost.api.app import create_app
from modelhost.artifacts.service import staging_prefix
from modelhost.cli.main import app as cli
from modelhost.container import Services
from modelhost.imports import runner as runner_module
from modelhost.imports import s3 as s3_module
from modelhost.imports.pace import Pace
from modelhost.imports.runner import ImportRunner
from modelhost.imports.s3 import S3Source, _vet, parse_s3
from modelhost.imports.sources import ImportFailed, RemoteFile, selected
from modelhost.outbound import parse_networks
from modelhost.store.models import ArtifactImport, ModelArtifact
from modelhost.store.types import new_id
from tests import hostile_archives as hostile
from tests.conftest import S3_REGION, make_settings
from tests.helpers import ADMIN_KEY, bearer
from tests.live import live_server
from tests.recipes import GGUF_FOLDER

FINAL = ("completed", "failed", "cancelled")
SECRET = "s3cr3t-never-shown-0123456789"
TENANT_KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}  # moto takes any
TINY = ("t03_feature_extraction", "st")


@pytest.fixture
def model(recipes: Path) -> Path:
    return recipes.joinpath(*TINY)


# ---------------------------------------------------------------- the runner, without a server


class FolderSource:
    """A source serving a folder's files; `held` files wait for `release`; `wrong` states a checksum
    ({path: ("etag" | "sha256", value)}) the bytes do not have. `reads` lists what was read."""

    description = "folder"

    def __init__(
        self, folder: Path, held: set[str] = frozenset(), wrong: dict[str, tuple[str, str]] | None = None
    ):
        self.folder = folder
        self.held = held
        self.release = asyncio.Event()
        self.wrong = wrong or {}
        self.reads: list[str] = []

    async def list_files(self) -> list[RemoteFile]:
        files = []
        for full in sorted(p for p in self.folder.rglob("*") if p.is_file()):
            path = full.relative_to(self.folder).as_posix()
            data = full.read_bytes()
            kind, value = self.wrong.get(path, ("etag", hashlib.md5(data).hexdigest()))
            files.append(RemoteFile(path, path, len(data), **{kind: value}))
        return files

    async def read(self, file: RemoteFile, offset: int = 0) -> AsyncIterator[bytes]:
        self.reads.append(file.path)
        if file.path in self.held:
            await self.release.wait()
        yield (self.folder / file.path).read_bytes()[offset:]


def local_services(tmp_path: Path, **settings: Any) -> Services:
    return Services.build(make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", **settings))


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Services]:
    monkeypatch.setattr(runner_module, "BEAT_SECONDS", 0.05)
    services = local_services(tmp_path, import_poll_seconds=0.05)
    yield services
    services.close()


def start_import(services: Services, **given: Any) -> tuple[str, str, str]:
    """(account, artifact, import) of a new import of `s3://models/tiny` into a new artifact."""
    view, _ = services.accounts.create("a", 10.0)
    account = view.account.id
    artifact = services.artifacts.create(account, "tiny", "feature-extraction").artifact.id
    row = services.imports.create(account, artifact, "s3://models/tiny", None, None, given.get("credentials"))
    return account, artifact, row.id


def running(services: Services, source: Any) -> ImportRunner:
    runner = ImportRunner(services.imports, services.artifacts, services.settings, lambda *_: source)
    runner.start_claiming()
    return runner


async def until(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        await asyncio.sleep(0.02)
    raise TimeoutError("condition not met")


def ended(services: Services, account: str, artifact: str, import_id: str) -> Callable[[], Any]:
    def check() -> ArtifactImport | None:
        row = services.imports.get(account, artifact, import_id)
        return row if row.status in FINAL else None

    return check


async def test_an_import_fills_the_session_in_parallel_and_the_artifact_becomes_ready(
    local: Services, model: Path
) -> None:
    account, artifact, import_id = start_import(local)
    source = FolderSource(model)
    runner = running(local, source)
    try:
        done = await until(ended(local, account, artifact, import_id))
    finally:
        await runner.stop()
    assert done.status == "completed", done.error_message
    size = sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
    assert (done.bytes_done, done.bytes_total) == (size, size)
    assert {f["status"] for f in done.files} == {"done"} and len(done.files) == len(source.reads)
    assert done.sealed is None  # what it kept secret is gone with it
    assert local.artifacts.get(account, artifact).artifact.status == "ready"


def recorded(services: Services, account: str, artifact: str, import_id: str) -> set[str]:
    """The paths the import's upload session holds, whole and verified."""
    upload_id = services.imports.get(account, artifact, import_id).upload_id
    _, files = services.artifacts.get_session(account, artifact, upload_id)
    return {f.path for f in files}


def files_of(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


async def test_a_resumed_import_fetches_only_the_files_not_yet_verified(local: Services, model: Path) -> None:
    account, artifact, import_id = start_import(local)
    first = FolderSource(model, held={"model.safetensors"})
    runner = running(local, first)
    expected = files_of(model)

    await until(lambda: recorded(local, account, artifact, import_id) == expected - {"model.safetensors"})
    await runner.stop()  # the server stops mid-import: the import is handed back, still running
    assert local.imports.get(account, artifact, import_id).status == "running"
    second = FolderSource(model)
    runner = running(local, second)
    try:
        done = await until(ended(local, account, artifact, import_id))
    finally:
        await runner.stop()
    assert done.status == "completed", done.error_message
    assert second.reads == ["model.safetensors"]
    assert local.artifacts.get(account, artifact).artifact.status == "ready"


async def test_an_import_whose_server_stopped_after_completing_it_ends_as_its_session_did(
    local: Services, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account, artifact, import_id = start_import(local)
    with monkeypatch.context() as crash:  # the server stops between the completion and the import's end
        crash.setattr(local.imports, "finish", lambda *_: None)
        runner = running(local, FolderSource(model))
        await until(lambda: local.artifacts.get(account, artifact).artifact.status == "ready")
        await until(lambda: not runner.running)
        await runner.stop()
    assert local.imports.get(account, artifact, import_id).status == "running"
    monkeypatch.setattr(local.settings, "import_stale_seconds", 0.2)  # its claim soon stale: taken over
    again = FolderSource(model)
    runner = running(local, again)
    try:
        done = await until(ended(local, account, artifact, import_id))
    finally:
        await runner.stop()
    assert done.status == "completed" and again.reads == []


def test_a_server_restarted_mid_import_resumes_it_without_fetching_again(tmp_path: Path, model: Path) -> None:
    """The supervisor's lifespan starts the runner, and hands its imports back when the server stops."""
    first, second = FolderSource(model, held={"model.safetensors"}), FolderSource(model)
    services = local_services(tmp_path, import_poll_seconds=0.05)
    account, artifact, import_id = start_import(services)
    assert services.supervisor is not None
    services.supervisor.imports.open_source = lambda *_: first
    with live_server(services.settings, create_app(services=services)):
        rest = files_of(model) - {"model.safetensors"}
        asyncio.run(until(lambda: recorded(services, account, artifact, import_id) == rest))
    services.close()
    services = local_services(tmp_path, import_poll_seconds=0.05)  # the server starts again
    assert services.supervisor is not None
    services.supervisor.imports.open_source = lambda *_: second
    try:
        with live_server(services.settings, create_app(services=services)):
            done = asyncio.run(until(ended(services, account, artifact, import_id)))
    finally:
        services.close()
    assert done.status == "completed", done.error_message
    assert second.reads == ["model.safetensors"]


async def test_an_import_outlives_its_upload_sessions_expiry(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "BEAT_SECONDS", 0.05)
    services = local_services(tmp_path, upload_session_ttl_seconds=1, import_poll_seconds=0.05)
    try:
        account, artifact, import_id = start_import(services)
        source = FolderSource(model, held={"model.safetensors"})
        runner = running(services, source)
        try:
            await asyncio.sleep(1.5)  # longer than a session lives unless the import keeps it open
            services.artifacts.sweep()
            source.release.set()
            done = await until(ended(services, account, artifact, import_id))
        finally:
            await runner.stop()
        assert done.status == "completed", done.error_message
    finally:
        services.close()


@pytest.mark.parametrize("kind", ["etag", "sha256"])
async def test_bytes_that_do_not_match_their_stated_checksum_fail_the_import(
    local: Services, model: Path, kind: str
) -> None:
    account, artifact, import_id = start_import(local)
    other = hashlib.md5(b"other").hexdigest() if kind == "etag" else hashlib.sha256(b"other").hexdigest()
    runner = running(local, FolderSource(model, wrong={"config.json": (kind, other)}))
    try:
        done = await until(ended(local, account, artifact, import_id))
    finally:
        await runner.stop()
    assert (done.status, done.error_code) == ("failed", "checksum_mismatch")
    assert "config.json" in (done.error_message or "")
    shown = local.artifacts.get(account, artifact).artifact
    assert (shown.status, shown.error_code) == ("failed", "checksum_mismatch")
    assert not local.blobs.exists(staging_prefix(done.upload_id))


async def test_cancelling_a_running_import_stops_it_and_restores_the_artifact(
    local: Services, model: Path
) -> None:
    account, artifact, import_id = start_import(local)
    source = FolderSource(model, held={"model.safetensors"})
    runner = running(local, source)
    try:
        rest = files_of(model) - {"model.safetensors"}
        await until(
            lambda: (
                "model.safetensors" in source.reads and recorded(local, account, artifact, import_id) == rest
            )
        )
        cancelled = local.imports.cancel(account, artifact, import_id)
        assert cancelled.status == "cancelled"
        await until(lambda: not runner.running)  # its fetches stopped at the next beat
    finally:
        await runner.stop()
    assert local.artifacts.get(account, artifact).artifact.status == "created"
    assert not local.blobs.exists(staging_prefix(cancelled.upload_id))


@pytest.mark.parametrize(
    ("limit", "code"),
    [
        ({"min_free_disk_mb": 10**9}, "insufficient_storage"),
        ({"max_upload_file_bytes": 10_000}, "too_large"),
        ({"max_upload_files": 3}, "too_large"),
    ],
)
async def test_an_import_past_the_disk_floor_or_the_upload_limits_fails_with_why(
    tmp_path: Path, model: Path, limit: dict[str, int], code: str
) -> None:
    services = local_services(tmp_path, **limit)
    try:
        account, artifact, import_id = start_import(services)
        runner = running(services, FolderSource(model))
        try:
            done = await until(ended(services, account, artifact, import_id))
        finally:
            await runner.stop()
        assert (done.status, done.error_code) == ("failed", code)
        assert services.artifacts.get(account, artifact).artifact.error_code == code
    finally:
        services.close()


def test_include_and_exclude_are_fnmatch_patterns_on_the_artifact_path() -> None:
    assert selected("1_Pooling/config.json", None, None)
    assert selected("model.safetensors", ["*.safetensors", "*.json"], None)
    assert not selected("pytorch_model.bin", ["*.safetensors", "*.json"], None)
    assert not selected("1_Pooling/config.json", None, ["1_Pooling/*"])
    assert selected("sub/x.json", ["*.json"], ["x.json"])  # `*` crosses folders; a pattern is the whole path


def test_an_s3_prefix_is_a_folder() -> None:
    assert parse_s3("s3://models/ab") == ("models", "ab/")
    assert parse_s3("s3://models/ab/") == ("models", "ab/")
    assert parse_s3("s3://models") == ("models", "")


async def test_an_s3_stream_cut_short_is_resumed_from_where_it_stopped(tmp_path: Path) -> None:
    from botocore.exceptions import ResponseStreamingError

    data = bytes(range(256)) * 10_000

    class Body:
        def __init__(self, start: int, cut: bool) -> None:
            self.rest, self.cut = data[start:], cut

        def read(self, size: int) -> bytes:
            if self.cut and len(self.rest) < len(data) // 2:
                raise ResponseStreamingError(error=ConnectionResetError())
            chunk, self.rest = self.rest[: size // 16], self.rest[size // 16 :]
            return chunk

        def close(self) -> None:
            pass

    bodies: list[tuple[str, Body]] = []

    class Client:
        def get_object(self, Bucket: str, Key: str, Range: str = "bytes=0-") -> dict[str, Body]:
            bodies.append((Range, Body(int(Range[6:-1]), cut=not bodies)))
            return {"Body": bodies[-1][1]}

    settings = make_settings(tmp_path, "sqlite://")
    source = S3Source("s3://models/x", include=None, exclude=None, credentials=None, settings=settings)
    source._client = Client()
    received = b"".join([chunk async for chunk in source.read(RemoteFile("w", "x/w", len(data)))])
    assert received == data
    (first, cut), (second, _) = bodies
    assert first == "bytes=0-" and second == f"bytes={len(data) - len(cut.rest)}-"


async def test_a_tenant_endpoint_on_a_private_address_is_refused_unless_its_network_is_allowed() -> None:
    with pytest.raises(ImportFailed) as refused:
        await _vet("http://127.0.0.1:9000", parse_networks([]))
    assert refused.value.code == "address_refused"
    with pytest.raises(ImportFailed, match="non-public"):  # allowing one network allows no other
        await _vet("http://169.254.169.254", parse_networks(["127.0.0.0/8"]))
    await _vet("http://127.0.0.1:9000", parse_networks(["127.0.0.0/8"]))


# ---------------------------------------------------------------- bounded in time, fair between accounts


class Trickle:
    """A source of one large file that sends a byte every `every` seconds, for as long as it is read;
    its listing takes `listing` seconds."""

    description = "trickle"

    def __init__(self, every: float = 0.05, listing: float = 0.0) -> None:
        self.every, self.listing = every, listing

    async def list_files(self) -> list[RemoteFile]:
        await asyncio.sleep(self.listing)
        return [RemoteFile("model.safetensors", "model.safetensors", 10**6)]

    async def read(self, file: RemoteFile, offset: int = 0) -> AsyncIterator[bytes]:
        while True:
            await asyncio.sleep(self.every)
            yield b"x"


def new_import(services: Services, account: str, source: str) -> tuple[str, str]:
    """(artifact, import) of a new import of `source` into a new artifact of `account`."""
    artifact = services.artifacts.create(account, source.rsplit("/", 1)[-1], "feature-extraction")
    row = services.imports.create(account, artifact.artifact.id, source, None, None, None)
    return artifact.artifact.id, row.id


async def test_one_accounts_trickling_imports_keep_no_other_accounts_import_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found on main (issue 58): one FIFO queue, no minimum rate; two imports sending a byte now and
    then held both slots, and every other account's import stayed `queued`."""
    monkeypatch.setattr(runner_module, "BEAT_SECONDS", 0.05)
    config_only = tmp_path / "config-only"  # fetched at once (inspection then refuses it: no matter)
    config_only.mkdir()
    (config_only / "config.json").write_text("{}")
    services = local_services(
        tmp_path,
        import_poll_seconds=0.05,
        import_concurrency=2,
        import_concurrency_per_account=1,
        import_min_bytes_per_second=1000,
        import_rate_window_seconds=0.5,
    )
    try:
        slow, other = (services.accounts.create(name, 10.0)[0].account.id for name in ("slow", "other"))
        first, second = (
            new_import(services, slow, "s3://models/trickle-1"),
            new_import(services, slow, "s3://models/trickle-2"),
        )
        theirs = new_import(services, other, "s3://models/tiny")
        claims: list[str] = []
        claim = services.imports.claim

        def recorded_claim(runner: str) -> Any:
            claimed = claim(runner)
            if claimed is not None:
                claims.append(claimed.id)
            return claimed

        monkeypatch.setattr(services.imports, "claim", recorded_claim)
        runner = ImportRunner(
            services.imports,
            services.artifacts,
            services.settings,
            lambda given, *_: Trickle() if "trickle" in str(given) else FolderSource(config_only),
        )
        runner.start_claiming()
        try:
            done = [
                await until(ended(services, account, *ids))
                for account, ids in ((other, theirs), (slow, first), (slow, second))
            ]
        finally:
            await runner.stop()
    finally:
        services.close()
    assert claims == [first[1], theirs[1], second[1]]  # the other account's turn came before `second`
    assert done[0].error_code != "source_too_slow" and done[0].bytes_done == 2  # fetched, then inspected
    for trickled in done[1:]:
        assert (trickled.status, trickled.error_code) == ("failed", "source_too_slow"), trickled.error_message
        assert 0 < trickled.bytes_done < 100 and "MODELHOST_IMPORT_MIN_BYTES_PER_SECOND" in (
            trickled.error_message or ""
        )


@pytest.mark.parametrize(
    ("settings", "source", "code"),
    [
        ({"import_deadline_seconds": 0.5, "import_min_bytes_per_second": 0}, Trickle(), "deadline_exceeded"),
        ({"import_list_deadline_seconds": 0.3}, Trickle(listing=3600), "source_too_slow"),
    ],
    ids=["fetch", "listing"],
)
async def test_an_import_past_its_deadline_fails_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: dict[str, float], source: Trickle, code: str
) -> None:
    monkeypatch.setattr(runner_module, "BEAT_SECONDS", 0.05)
    services = local_services(tmp_path, import_poll_seconds=0.05, **settings)
    try:
        account, artifact, import_id = start_import(services)
        runner = running(services, source)
        try:
            done = await until(ended(services, account, artifact, import_id), timeout=10)
        finally:
            await runner.stop()
        assert (done.status, done.error_code) == ("failed", code), done.error_message
        assert services.artifacts.get(account, artifact).artifact.error_code == code
    finally:
        services.close()


class ArchiveSource:
    """A source of one archive to unpack, served from memory."""

    description = "archive"

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def list_files(self) -> list[RemoteFile]:
        return [RemoteFile("model.tgz", "model.tgz", len(self.data), archive=True)]

    async def read(self, file: RemoteFile, offset: int = 0) -> AsyncIterator[bytes]:
        yield self.data[offset:]


async def test_a_sparse_archive_is_refused_before_a_byte_is_staged(
    local: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found on main (issue 58): 269 bytes of .tar.gz staged a 200 MiB file, against a 64 MiB bound."""
    staged = 0
    put_file = local.artifacts.put_file

    async def counted(*args: Any, **kwargs: Any) -> Any:
        async def chunks() -> AsyncIterator[bytes]:
            nonlocal staged
            async for chunk in args[4]:
                staged += len(chunk)
                yield chunk

        return await put_file(*args[:4], chunks(), *args[5:], **kwargs)

    monkeypatch.setattr(local.artifacts, "put_file", counted)
    account, artifact, import_id = start_import(local)
    runner = running(local, ArchiveSource(hostile.sparse_tar_gz(200 * 1024**2)))
    try:
        done = await until(ended(local, account, artifact, import_id))
    finally:
        await runner.stop()
    assert (done.status, done.error_code) == ("failed", "unsafe_archive"), done.error_message
    assert staged == 0 and recorded(local, account, artifact, import_id) == set()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_pace_is_measured_over_windows_of_downloading_only(tmp_path: Path) -> None:
    clock = Clock()
    settings = make_settings(
        tmp_path, "sqlite://", import_min_bytes_per_second=100, import_rate_window_seconds=10
    )
    pace = Pace(settings, clock)
    assert pace.check(0, downloading=1) is None  # the first window starts
    clock.now += 10
    assert pace.check(1000, downloading=1) is None  # 100 bytes/s: enough
    clock.now += 5
    assert pace.check(1000, downloading=0) is None  # listing or unpacking: no window
    clock.now += 60
    assert pace.check(1000, downloading=1) is None  # a new window, not the pause
    clock.now += 10
    slow = pace.check(1999, downloading=2)
    assert slow is not None and slow.code == "source_too_slow" and "sent 99 bytes/s" in slow.message
    clock.now += 24 * 3600
    late = pace.check(10**9, downloading=1)
    assert late is not None and late.code == "deadline_exceeded"


class ManyKeys:
    """An S3 client whose bucket holds `pages` pages of keys under any prefix, each page made when the
    listing asks for it (after `delay` seconds, in the listing's thread); `asked` counts them."""

    def __init__(self, pages: int, delay: float = 0.0) -> None:
        self.pages, self.delay, self.asked = pages, delay, 0

    def get_paginator(self, name: str) -> ManyKeys:
        return self

    def paginate(
        self, Bucket: str, Prefix: str, PaginationConfig: dict[str, int] | None = None
    ) -> Iterator[dict[str, Any]]:
        size = (PaginationConfig or {}).get("PageSize", 1000)
        for page in range(self.pages):
            time.sleep(self.delay)
            self.asked += 1
            keys = [f"{Prefix}{page:04}/{i:04}.json" for i in range(size)]
            yield {"Contents": [{"Key": key, "Size": 2, "ETag": '"etag"'} for key in keys]}


def many_keys_source(tmp_path: Path, client: ManyKeys) -> S3Source:
    settings = make_settings(tmp_path, "sqlite://")  # at most 10,000 files in an artifact
    source = S3Source("s3://models/many", include=None, exclude=None, credentials=None, settings=settings)
    source._client = client
    return source


async def test_an_s3_listing_stops_one_file_past_the_limit(tmp_path: Path) -> None:
    """Found on main (issue 58): 200 pages of keys were all asked for where 11 already pass the limit."""
    client = ManyKeys(pages=200)
    listed = await many_keys_source(tmp_path, client).list_files()
    assert len(listed) == 10_001 and client.asked == 11  # the runner fails it `too_large`


async def test_a_cancelled_s3_listing_asks_for_no_more_pages(tmp_path: Path) -> None:
    """Found on main: the listing went on for 170 pages after its import was cancelled."""
    client = ManyKeys(pages=200, delay=0.02)
    listing = asyncio.create_task(many_keys_source(tmp_path, client).list_files())
    await until(lambda: client.asked >= 3)
    listing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await listing
    await asyncio.sleep(0.1)  # the page in flight when it was cancelled
    asked = client.asked
    await asyncio.sleep(0.2)
    assert client.asked == asked <= 5


def rebinding_dns(monkeypatch: pytest.MonkeyPatch, name: str, public: str, private: str) -> list[str]:
    """`name` resolves to `public` and `private` in turn, one answer a lookup (a rebinding resolver with
    no cache: whoever looks twice sees both); the answers given are listed."""
    real = socket.getaddrinfo
    answers: list[str] = []

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != name:
            return real(host, port, *args, **kwargs)
        answers.append(private if len(answers) % 2 else public)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[-1], int(port or 0)))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


async def test_an_s3_endpoint_that_rebinds_to_a_private_address_is_never_connected_to(
    local: Services, bucket: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found on main (issue 58): the endpoint was vetted with one lookup and boto3 connected by name with
    another, so a second answer of 127.0.0.1 fetched what listens there and staged it."""
    port = s3_endpoint.rsplit(":", 1)[1]
    answers = rebinding_dns(monkeypatch, "rebinding-s3", public="93.184.216.34", private="127.0.0.1")
    account, artifact, import_id = start_import(
        local, credentials={**TENANT_KEYS, "endpoint_url": f"http://rebinding-s3:{port}"}
    )
    runner = ImportRunner(local.imports, local.artifacts, local.settings)  # the real S3 source
    runner.start_claiming()
    try:
        done = await until(ended(local, account, artifact, import_id))
    finally:
        await runner.stop()
    assert (done.files, done.bytes_total) == ([], None)  # not even the listing came from 127.0.0.1
    assert (done.status, done.error_code) == ("failed", "address_refused"), done.error_message
    assert answers == ["93.184.216.34", "127.0.0.1"]  # the early check's, then the connection's, refused
    assert done.bytes_done == 0 and recorded(local, account, artifact, import_id) == set()


async def test_each_connection_to_a_tenant_s3_endpoint_checks_the_address_it_connects_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not the early check (skipped here) but the connection itself refuses a private address."""

    async def skipped(*_: object) -> None:
        pass

    monkeypatch.setattr(s3_module, "_vet", skipped)
    rebinding_dns(monkeypatch, "private-s3", public="127.0.0.1", private="127.0.0.1")
    credentials = {**TENANT_KEYS, "endpoint_url": "http://private-s3:9"}
    settings = make_settings(tmp_path, "sqlite://")
    source = S3Source(
        "s3://models/tiny", include=None, exclude=None, credentials=credentials, settings=settings
    )
    with pytest.raises(ImportFailed) as refused:
        await source.list_files()
    assert (
        refused.value.code == "address_refused" and "MODELHOST_MEDIA_ALLOW_NETWORKS" in refused.value.message
    )


async def test_a_tenant_s3_endpoint_in_an_allowed_network_is_read_through_vetted_connections(
    tmp_path: Path, bucket: str, s3_endpoint: str, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = s3_endpoint.rsplit(":", 1)[1]
    answers = rebinding_dns(monkeypatch, "tenant-s3", public="127.0.0.1", private="127.0.0.1")
    settings = make_settings(tmp_path, "sqlite://", media_allow_networks=["127.0.0.0/8"])
    credentials = {**TENANT_KEYS, "endpoint_url": f"http://tenant-s3:{port}"}
    source = S3Source(
        "s3://models/tiny", include=None, exclude=None, credentials=credentials, settings=settings
    )
    listed = {f.path: f for f in await source.list_files()}
    assert set(listed) >= {"config.json", "modules.json"}
    read = b"".join([chunk async for chunk in source.read(listed["config.json"])])
    assert read == (model / "config.json").read_bytes()
    assert len(answers) >= 3  # the early check, then each connection's own lookup


# ---------------------------------------------------------------- the routes, through the app


@pytest.fixture
async def app_client(local: Services) -> AsyncIterator[httpx.AsyncClient]:
    """The app without its lifespan: imports are created and stay `queued` (no runner)."""
    transport = httpx.ASGITransport(app=create_app(services=local), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://modelhost.test") as http:
        yield http


async def new_key(http: httpx.AsyncClient) -> str:
    made = await http.post("/v1/admin/accounts", json={"name": "a"}, headers=bearer(ADMIN_KEY))
    key: str = made.json()["api_key"]
    return key


async def new_artifact(http: httpx.AsyncClient, key: str) -> str:
    body = {"display_name": "tiny", "pipeline": "feature-extraction"}
    made = await http.post("/v1/model-artifacts", json=body, headers=bearer(key))
    artifact: str = made.json()["id"]
    return artifact


async def test_credentials_are_sealed_at_rest_and_never_returned(
    local: Services, app_client: httpx.AsyncClient
) -> None:
    key = await new_key(app_client)
    artifact = await new_artifact(app_client, key)
    credentials = {"aws_access_key_id": "AKIDEXAMPLE", "aws_secret_access_key": SECRET}
    body = {"source": "s3://models/tiny", "credentials": credentials}
    started = await app_client.post(f"/v1/model-artifacts/{artifact}/imports", json=body, headers=bearer(key))
    assert started.status_code == 202, started.text
    shown = started.json()
    assert (shown["object"], shown["status"], shown["source"]) == (
        "model_artifact.import",
        "queued",
        "s3://models/tiny",
    )
    base = f"/v1/model-artifacts/{artifact}"
    answers = [started, await app_client.get(f"{base}/imports/{shown['id']}", headers=bearer(key))]
    answers.append(await app_client.get(base, headers=bearer(key)))
    answers.append(await app_client.get("/v1/audit", headers=bearer(key)))
    assert answers[2].json()["import_id"] == shown["id"] and answers[2].json()["status"] == "ingesting"
    for answer in answers:
        assert SECRET not in answer.text and "AKIDEXAMPLE" not in answer.text
    database = str(local.settings.database_url).removeprefix("sqlite:///")
    with sqlite3.connect(database) as raw:
        dumped = "\n".join(raw.iterdump())
        (sealed,) = raw.execute("select sealed from artifact_imports").fetchone()
    assert SECRET not in dumped and "AKIDEXAMPLE" not in dumped  # audit rows included
    assert sealed and local.imports._sealer.open(sealed)["credentials"] == credentials
    assert (local.settings.data_dir / "secrets.key").stat().st_mode & 0o777 == 0o600


async def test_cancelling_a_queued_import_returns_the_artifact_to_its_previous_status(
    app_client: httpx.AsyncClient,
) -> None:
    key = await new_key(app_client)
    artifact = await new_artifact(app_client, key)
    base = f"/v1/model-artifacts/{artifact}/imports"
    started = (await app_client.post(base, json={"source": "s3://models/tiny"}, headers=bearer(key))).json()
    busy = await app_client.post(base, json={"source": "s3://models/tiny"}, headers=bearer(key))
    assert (busy.status_code, busy.json()["error"]["code"]) == (409, "artifact_busy")
    cancelled = await app_client.delete(f"{base}/{started['id']}", headers=bearer(key))
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    shown = (await app_client.get(f"/v1/model-artifacts/{artifact}", headers=bearer(key))).json()
    assert (shown["status"], shown["upload_id"], shown["import_id"]) == ("created", None, None)
    again = await app_client.delete(f"{base}/{started['id']}", headers=bearer(key))
    assert (again.status_code, again.json()["error"]["code"]) == (409, "import_not_active")


async def test_another_account_can_neither_see_nor_cancel_an_import(app_client: httpx.AsyncClient) -> None:
    key, other = await new_key(app_client), await new_key(app_client)
    artifact = await new_artifact(app_client, key)
    base = f"/v1/model-artifacts/{artifact}/imports"
    started = (await app_client.post(base, json={"source": "s3://models/tiny"}, headers=bearer(key))).json()
    for method in ("GET", "DELETE"):
        answer = await app_client.request(method, f"{base}/{started['id']}", headers=bearer(other))
        assert (answer.status_code, answer.json()["error"]["code"]) == (404, "import_not_found"), method
    own = await app_client.get(f"{base}/{started['id']}", headers=bearer(key))
    assert own.json()["status"] == "queued"


async def test_creating_an_import_needs_credits_as_a_files_upload_does(
    local: Services, app_client: httpx.AsyncClient
) -> None:
    """Found on main (issue 58): an account without credits had three imports accepted. (Its artifact is
    made through the store: making one is admitted too, since issue 70.)"""
    made = await app_client.post(
        "/v1/admin/accounts", json={"name": "broke", "credits": 0}, headers=bearer(ADMIN_KEY)
    )
    key = made.json()["api_key"]
    with local.database.transaction() as session:
        row = ModelArtifact(
            id=new_id("art"), account_id=made.json()["id"], display_name="tiny", pipeline="feature-extraction"
        )
        session.add(row)
        artifact = row.id
    answer = await app_client.post(
        f"/v1/model-artifacts/{artifact}/imports", json={"source": "s3://models/tiny"}, headers=bearer(key)
    )
    assert answer.status_code == 402 and answer.json()["error"]["code"] == "insufficient_credits", answer.text
    shown = (await app_client.get(f"/v1/model-artifacts/{artifact}", headers=bearer(key))).json()
    assert shown["status"] == "created"  # no session was opened


async def test_creating_an_import_counts_against_the_keys_rate_limit(app_client: httpx.AsyncClient) -> None:
    """Found on main: a key limited to one request a minute had four imports accepted."""
    account_key = await new_key(app_client)
    made = await app_client.post(
        "/v1/keys", json={"name": "slow", "limits": {"requests_per_minute": 1}}, headers=bearer(account_key)
    )
    key = made.json()["api_key"]
    answers = []
    for _ in range(2):
        artifact = await new_artifact(app_client, account_key)
        answers.append(
            await app_client.post(
                f"/v1/model-artifacts/{artifact}/imports",
                json={"source": "s3://models/tiny"},
                headers=bearer(key),
            )
        )
    assert answers[0].status_code == 202, answers[0].text
    assert answers[1].status_code == 429, answers[1].text
    assert answers[1].json()["error"]["code"] == "rate_limit_exceeded"
    assert "Retry-After" in answers[1].headers


async def test_a_malformed_source_or_credentials_are_refused_before_anything_starts(
    app_client: httpx.AsyncClient,
) -> None:
    key = await new_key(app_client)
    artifact = await new_artifact(app_client, key)
    malformed: list[tuple[Any, Any, str]] = [
        (source, None, "source")
        for source in (
            "ftp://host/model",
            "s3://",
            "s3://Bad_Bucket!/x",
            "not a url",
            ["s3://a/b", "s3://a/c"],
        )
    ]
    malformed += [
        ("s3://models/tiny", {"aws_access_key_id": "only the id"}, "credentials"),
        ("s3://models/tiny", {"password": SECRET}, "credentials"),
        ("s3://models/tiny", {"endpoint_url": "file:///etc"}, "credentials.endpoint_url"),
    ]
    for source, credentials, param in malformed:
        body = {"source": source, "credentials": credentials}
        answer = await app_client.post(
            f"/v1/model-artifacts/{artifact}/imports", json=body, headers=bearer(key)
        )
        assert (answer.status_code, answer.json()["error"]["param"]) == (400, param), answer.text
        assert SECRET not in answer.text
    shown = (await app_client.get(f"/v1/model-artifacts/{artifact}", headers=bearer(key))).json()
    assert shown["status"] == "created"


# ---------------------------------------------------------------- S3 and the CLI, on a live server


@pytest.fixture(scope="module")
def bucket(s3_endpoint: str, recipes: Path) -> str:
    """`models`: the tiny model under `tiny/` (and a file to exclude), `tinyx/`, which is not in it, and a
    public GGUF file."""
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name=S3_REGION)
    s3.create_bucket(Bucket="models")
    folder = recipes.joinpath(*TINY)
    for full in (p for p in folder.rglob("*") if p.is_file()):
        s3.put_object(
            Bucket="models", Key=f"tiny/{full.relative_to(folder).as_posix()}", Body=full.read_bytes()
        )
    s3.put_object(Bucket="models", Key="tiny/extra/notes.bin", Body=b"not for the model")
    s3.put_object(Bucket="models", Key="tinyx/stray.json", Body=b"{}")
    gguf = recipes / GGUF_FOLDER / "qwen3-Q4_0" / "qwen3-Q4_0.gguf"
    # public: an import without credentials reads it unsigned (the operator's keys are never lent here)
    s3.put_object(Bucket="models", Key="gguf/qwen3-Q4_0.gguf", Body=gguf.read_bytes(), ACL="public-read")
    return "models"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str, bucket: str) -> Iterator[str]:
    """A live server whose operator's S3 endpoint (AWS_ENDPOINT_URL) is moto's."""
    root = tmp_path_factory.mktemp("imports")
    settings = make_settings(
        root, f"sqlite:///{root / 'db.sqlite'}", import_poll_seconds=0.2, worker_threads=1
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ENDPOINT_URL", s3_endpoint)
        with live_server(settings) as url:
            yield url


@pytest.fixture
def key(server: str) -> str:
    made = httpx.post(f"{server}/v1/admin/accounts", json={"name": "importer"}, headers=bearer(ADMIN_KEY))
    value: str = made.json()["api_key"]
    return value


def import_and_wait(
    server: str, key: str, body: dict[str, Any], pipeline: str = "feature-extraction"
) -> dict[str, Any]:
    made = httpx.post(
        f"{server}/v1/model-artifacts",
        json={"display_name": "t", "pipeline": pipeline},
        headers=bearer(key),
    )
    base = f"{server}/v1/model-artifacts/{made.json()['id']}/imports"
    started = httpx.post(base, json=body, headers=bearer(key))
    assert started.status_code == 202, started.text
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        shown: dict[str, Any] = httpx.get(f"{base}/{started.json()['id']}", headers=bearer(key)).json()
        if shown["status"] in FINAL:
            return shown
        time.sleep(0.1)
    raise TimeoutError(shown)


def test_an_s3_import_becomes_ready_and_serves_embeddings(server: str, key: str) -> None:
    credentials = {"aws_access_key_id": "testing", "aws_secret_access_key": SECRET}  # moto takes any
    body = {"source": "s3://models/tiny", "exclude": ["extra/*"], "credentials": credentials}
    done = import_and_wait(server, key, body)
    assert done["status"] == "completed", done
    paths = {f["path"] for f in done["files"]}
    assert "config.json" in paths and "1_Pooling/config.json" in paths
    assert not any(p.startswith(("extra/", "stray")) for p in paths)  # excluded; `tinyx/` is not `tiny/`
    assert done["bytes_done"] == done["bytes_total"] > 0 and SECRET not in json.dumps(done)
    artifact = done["artifact_id"]
    shown = httpx.get(f"{server}/v1/model-artifacts/{artifact}", headers=bearer(key)).json()
    assert shown["status"] == "ready" and shown["import_id"] is None
    deployed = httpx.post(
        f"{server}/v1/deployments", json={"model": "imported", "artifact_id": artifact}, headers=bearer(key)
    )
    assert deployed.status_code == 201, deployed.text
    embedded = httpx.post(
        f"{server}/v1/embeddings", json={"model": "imported", "input": "hi"}, headers=bearer(key), timeout=120
    )
    assert embedded.status_code == 200 and embedded.json()["data"][0]["embedding"], embedded.text


def test_an_s3_source_naming_one_object_imports_that_file(server: str, key: str) -> None:
    done = import_and_wait(server, key, {"source": "s3://models/gguf/qwen3-Q4_0.gguf"}, "text-generation")
    assert done["status"] == "completed", done
    assert [f["path"] for f in done["files"]] == ["qwen3-Q4_0.gguf"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"source": "s3://no-such-bucket/tiny"}, "source_not_found"),
        ({"source": "s3://models/nothing-here"}, "source_not_found"),
        ({"source": "s3://models/tiny", "include": ["*.gguf"]}, "source_not_found"),
        ({"source": "s3://models/tiny", "credentials": {"endpoint_url": "ENDPOINT"}}, "address_refused"),
    ],
)
def test_an_s3_import_that_cannot_fetch_fails_with_why(
    server: str, key: str, s3_endpoint: str, body: dict[str, Any], code: str
) -> None:
    if "credentials" in body:  # a tenant's own endpoint, on this machine's loopback
        body = {**body, "credentials": {"endpoint_url": s3_endpoint}}
    done = import_and_wait(server, key, body)
    assert (done["status"], done["error"]["code"]) == ("failed", code), done
    shown = httpx.get(f"{server}/v1/model-artifacts/{done['artifact_id']}", headers=bearer(key)).json()
    assert (shown["status"], shown["error"]["code"]) == ("failed", code)


def test_the_cli_imports_from_s3_with_a_progress_bar(server: str, key: str, tmp_path: Path) -> None:
    credentials = tmp_path / "s3.json"
    credentials.write_text(json.dumps({"aws_access_key_id": "testing", "aws_secret_access_key": SECRET}))
    arguments = [
        "artifacts",
        "import",
        "s3://models/tiny",
        "--pipeline",
        "feature-extraction",
        "--name",
        "cli",
    ]
    arguments += [
        "--exclude",
        "extra/*",
        "--credentials-file",
        str(credentials),
        "--url",
        server,
        "--key",
        key,
    ]
    result = CliRunner().invoke(cli, arguments, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "ready" in result.output and "kB" in result.output and SECRET not in result.output
    arguments = ["artifacts", "import", "s3://models/none", "--pipeline", "feature-extraction"]
    arguments += ["--url", server, "--key", key]  # no --name: the source's last segment
    failed = CliRunner().invoke(cli, arguments, catch_exceptions=False)
    assert failed.exit_code == 1 and "source_not_found" in failed.output
