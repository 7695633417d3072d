"""Generated files behind signed, expiring links (`services.files`), without a server; and the Files API
under the rules every tenant's writes follow (issue 49): uploads and downloads streamed in bounded
memory, a batch's input refused at its first bad line, the free-disk floor, credits, storage billing
and rate limits, and bounded echoes of what a client sent."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sqlalchemy import update

from modelhost.api.app import create_app
from modelhost.artifacts.blobstore import LocalBlobStore
from modelhost.batches.input import (
    MAX_CUSTOM_ID,
    MAX_DEPTH,
    MAX_LINES,
    JsonlCheck,
    LineError,
    check_lines,
)
from modelhost.container import Services
from modelhost.errors import InvalidRequest, NotFound
from modelhost.services.files import FileService, file_secret
from modelhost.store import migrate
from modelhost.store.db import Database
from modelhost.store.models import Account, GeneratedFile
from modelhost.store.types import utcnow
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, ManualClock, assert_error, bearer, new_account, runner_lines
from tests.live import live_server

MB = 1024 * 1024
T0 = 1_795_305_600_000  # 2026-11-22T00:00:00Z


@pytest.fixture
def files(sqlite_url: str, tmp_path: Path) -> FileService:
    database = Database(sqlite_url)
    migrate.upgrade(database)
    with database.transaction() as session:
        session.add(Account(id="acct_a", name="a"))
    return FileService(database, LocalBlobStore(tmp_path / "blobs"), b"secret", ttl_seconds=60)


def link(files: FileService, data: bytes = b"png-bytes") -> tuple[str, int, str]:
    url = files.url("http://gw/", files.store("acct_a", data, "image/png", "png"))
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    assert parsed.path.startswith("/v1/files/file_") and parsed.path.endswith("/content")
    return parsed.path.split("/")[3], int(query["expires"][0]), query["signature"][0]


def test_a_genuine_link_reads_the_file(files: FileService) -> None:
    file_id, expires, signature = link(files)
    assert files.read(file_id, expires, signature) == (b"png-bytes", "image/png")


@pytest.mark.parametrize("tamper", ["signature", "expires", "id"])
def test_a_tampered_link_is_not_found(files: FileService, tamper: str) -> None:
    file_id, expires, signature = link(files)
    if tamper == "signature":
        signature = signature[:-1] + ("0" if signature[-1] != "0" else "1")
    elif tamper == "expires":
        expires += 3600  # a later expiry needs a new signature
    else:
        file_id = link(files, b"other")[0]
    with pytest.raises(NotFound):
        files.read(file_id, expires, signature)


def test_an_expired_link_is_not_found_and_the_sweep_deletes_the_file(files: FileService) -> None:
    file_id, expires, signature = link(files)
    with files._database.transaction() as session:
        session.execute(update(GeneratedFile).values(expires_at=utcnow() - timedelta(seconds=1)))
    with pytest.raises(NotFound):
        files.read(file_id, expires, signature)
    assert files.sweep() == 1
    assert files.sweep() == 0
    assert files._blobs.list("generated") == []


def test_the_secret_is_made_once_and_kept_in_the_data_directory(tmp_path: Path) -> None:
    first = file_secret(tmp_path, None)
    assert first == file_secret(tmp_path, None) and len(first) == 64
    assert (tmp_path / "file-url-secret").stat().st_mode & 0o077 == 0
    assert file_secret(tmp_path, "operator-secret") == b"operator-secret"


# ---------------------------------------------------------------- the Files API over HTTP

BOUNDARY = "modelhost-test-boundary"
MAX_LINE_BYTES = 1 * MB  # the module's request body limit, and so a batch line's


@dataclass
class FilesApi:
    services: Services
    app: FastAPI
    http: httpx.AsyncClient
    clock: ManualClock
    key: str

    @property
    def blobs(self) -> Path:
        return self.services.settings.data_dir / "blobs" / "files"


@pytest.fixture(scope="module")
async def api(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FilesApi]:
    """One in-process gateway (SQLite) whose clock moves only when told, storage billed at 1,000
    micro-credits per GB-second, and an account with credits."""
    root = tmp_path_factory.mktemp("files-api")
    settings = make_settings(
        root,
        f"sqlite:///{root / 'files.db'}",
        max_body_bytes=MAX_LINE_BYTES,
        billing_storage_credits_per_gb_hour=Decimal("3.6"),
        billing_tick_seconds=86_400,
    )
    clock = ManualClock(T0)
    services = Services.build(settings, clock=clock)
    app = create_app(services=services)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://modelhost.test", timeout=60) as http:
        account = await new_account(http, name="files")
        yield FilesApi(services, app, http, clock, account["api_key"])
    services.close()


def form_head(purpose: str | None, filename: str = "requests.jsonl") -> bytes:
    """A multipart form's bytes up to its file's: `purpose` first, as the openai SDK sends it."""
    head = b""
    if purpose is not None:
        head += field_part("purpose", purpose)
    return (
        head
        + (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
    )


def field_part(name: str, value: str) -> bytes:
    return f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()


def form_tail(after: bytes = b"") -> bytes:
    return b"\r\n" + after + f"--{BOUNDARY}--\r\n".encode()


FORM = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


async def upload(
    api: FilesApi, data: bytes, purpose: str = "batch", key: str | None = None
) -> httpx.Response:
    return await api.http.post(
        "/v1/files",
        files={"file": ("requests.jsonl", data)},
        data={"purpose": purpose},
        headers=bearer(key or api.key),
    )


def jsonl(*lines: Any) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def line(custom_id: str = "a", **body: Any) -> dict[str, Any]:
    body = {"model": "m", "input": "x", **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}


@dataclass
class Growth:
    bytes: int = 0


@contextmanager
def memory_growth() -> Iterator[Growth]:
    """How far this process's resident memory rose above its level at the start of the block, at its
    peak (the kernel's, reset first: `clear_refs` 5), measured as the block ends."""
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kb("VmRSS")
    growth = Growth()
    yield growth
    growth.bytes = (_status_kb("VmHWM") - before) * 1024


def _status_kb(name: str) -> int:
    for row in Path("/proc/self/status").read_text().splitlines():
        if row.startswith(name + ":"):
            return int(row.split()[1])
    raise AssertionError(f"{name} not in /proc/self/status")


async def test_a_200_mb_file_of_empty_objects_is_refused_at_its_50001st_line_having_read_little(
    api: FilesApi,
) -> None:
    """The server stops at the first line past the limit: it has read about a megabyte of the 200 MB
    when it answers (the rest is never pulled from the client), and its memory stays flat."""
    lines = b"{}\n" * (64 * 1024 // 3)
    total = 200 * MB
    pulled = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal pulled
        yield form_head("batch")
        while pulled < total:
            pulled += len(lines)
            yield lines
        yield form_tail()

    started = time.perf_counter()
    with memory_growth() as growth:
        response = await api.http.post("/v1/files", content=body(), headers={**FORM, **bearer(api.key)})
    elapsed = time.perf_counter() - started
    error = assert_error(response, 400, "invalid_file_format", param="file")
    assert (
        f"Line {MAX_LINES + 1} " in error["message"] and f"at most {MAX_LINES} requests" in error["message"]
    )
    assert pulled < 4 * MB, f"the server read {pulled} bytes of a file refused at byte {3 * (MAX_LINES + 1)}"
    assert growth.bytes < 48 * MB, f"resident memory rose by {growth.bytes / MB:.1f} MB"
    assert stored_files(api) == []
    print(f"refused after {pulled / MB:.2f} MB read, in {elapsed:.3f} s, memory +{growth.bytes / MB:.1f} MB")


def stored_files(api: FilesApi) -> list[Path]:
    """The files' bytes in the blob store, partial ones included."""
    return [path for path in api.blobs.rglob("*") if path.is_file()]


def nested(depth: int) -> dict[str, Any]:
    """A line whose `body.input` nests arrays so that the line has `depth` levels in all."""
    value: Any = "x"
    for _ in range(depth - 2):
        value = [value]
    return line(input=value)


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (line(background=True), "'body.background'"),
        (nested(MAX_DEPTH + 1), f"nests deeper than {MAX_DEPTH} levels"),
        (nested(300), f"nests deeper than {MAX_DEPTH} levels"),  # what orjson parses but cannot encode
        ({**line(), "custom_id": "c" * (MAX_CUSTOM_ID + 1)}, f"more than {MAX_CUSTOM_ID} characters"),
    ],
    ids=["background", "deep", "deeper-than-orjson-encodes", "long-custom-id"],
)
async def test_a_line_no_batch_can_run_is_refused_at_upload_naming_it(
    api: FilesApi, bad: dict[str, Any], says: str
) -> None:
    response = await upload(api, jsonl(line("a"), nested(MAX_DEPTH), bad))
    error = assert_error(response, 400, "invalid_file_format", param="file")
    assert (
        error["message"].startswith("Invalid file format for Batch API. Line 3 ") and says in error["message"]
    )


async def test_lines_too_deep_or_too_long_to_parse_are_refused_naming_them(api: FilesApi) -> None:
    too_deep = b'{"custom_id": "d", "body": ' + b"[" * 1100 + b"]" * 1100 + b"}\n"
    error = assert_error(await upload(api, jsonl(line()) + too_deep), 400, "invalid_file_format")
    assert f"Line 2 nests deeper than {MAX_DEPTH} levels" in error["message"]
    too_long = jsonl(line("a"), line("b", input="x" * MAX_LINE_BYTES))
    error = assert_error(await upload(api, too_long), 400, "invalid_file_format")
    assert f"Line 2 has more than {MAX_LINE_BYTES} bytes" in error["message"]


async def test_a_batch_file_whose_purpose_comes_after_it_is_checked_and_leaves_nothing_when_refused(
    api: FilesApi,
) -> None:
    def form(data: bytes) -> bytes:
        return form_head(None) + data + form_tail(after=field_part("purpose", "batch"))

    headers = {**FORM, **bearer(api.key)}
    refused = await api.http.post("/v1/files", content=form(jsonl(line("a"), [1])), headers=headers)
    assert "Line 2 is not a JSON object" in assert_error(refused, 400, "invalid_file_format")["message"]
    assert stored_files(api) == []
    accepted = await api.http.post("/v1/files", content=form(jsonl(line("a"))), headers=headers)
    assert accepted.status_code == 200 and accepted.json()["purpose"] == "batch", accepted.text
    assert (
        await api.http.delete(f"/v1/files/{accepted.json()['id']}", headers=bearer(api.key))
    ).status_code == 200


async def test_a_form_cut_short_is_refused_and_leaves_nothing(api: FilesApi) -> None:
    """A body that ends inside its file part (no closing boundary) is not taken for the whole file."""
    cut = form_head("user_data") + b"the first half of a file"
    refused = await api.http.post("/v1/files", content=cut, headers={**FORM, **bearer(api.key)})
    assert "closing boundary" in assert_error(refused, 400)["message"]
    assert stored_files(api) == []


@given(
    lines=st.lists(
        st.tuples(
            st.sampled_from([b'{"custom_id": "a"}', b"", b"  ", b"[1]", b"{", b'{"x": "\r"}']),
            st.sampled_from([b"\n", b"\r", b"\r\n", b"\n\r", b""]),
        ),
        max_size=8,
    ),
    draw=st.data(),
)
@example(lines=[(b"{}", b"\r\n"), (b"[1]", b"\n")], draw=None)  # cut between the `\r` and its `\n`
@settings(max_examples=200, deadline=None, database=None)
def test_the_streamed_check_numbers_lines_as_the_runner_does_however_the_bytes_arrive(
    lines: list[tuple[bytes, bytes]], draw: st.DataObject | None
) -> None:
    """Chunks may end anywhere, between a `\\r` and its `\\n` too: the check names the line the
    runner's reader would (both split as `bytes.splitlines`)."""
    data = b"".join(text + end for text, end in lines)
    positions = st.lists(st.integers(0, len(data)), max_size=len(data))
    cuts = draw.draw(positions) if draw is not None else [data.index(b"\r") + 1]
    bounds = [0, *sorted(cuts), len(data)]
    read = runner_lines(data)
    not_objects = [e.line for e in read if isinstance(e, LineError) and e.code == "invalid_json_line"]
    check = JsonlCheck(max_bytes=MB, max_line_bytes=MB)
    try:
        for start, end in itertools.pairwise(bounds):
            check.feed(data[start:end])
        count = check.finish()
    except InvalidRequest as refused:
        assert (f"Line {not_objects[0]} " if not_objects else "empty") in refused.message, refused.message
    else:
        assert not not_objects and count == len(read)


def test_a_line_naming_another_endpoint_is_quoted_only_in_part() -> None:
    """What a batch's errors quote of a client's line is bounded (the runner's check, at creation)."""
    url = "/v1/" + "u" * 10_000
    data = jsonl(line("a"), {**line("b"), "url": url})
    errors = check_lines(runner_lines(data), "/v1/embeddings", lambda model: None)
    assert [(e.code, e.line) for e in errors] == [("invalid_url", 2)]
    assert len(errors[0].message) < 200 and "uuuu..." in errors[0].message, errors[0].message


async def test_a_lines_unknown_model_is_quoted_only_in_part(api: FilesApi) -> None:
    """The batch runner's reason for a line's model that is not the caller's (its `model_not_found`)."""
    principal = api.services.authenticator.load(api.key)
    assert principal is not None and api.services.supervisor is not None
    model = "m" * 10_000
    reason = await api.services.supervisor.batches.check_model(principal, "/v1/embeddings", model)
    assert reason is not None and "does not exist" in reason and len(reason) < 200, reason


async def test_batch_metadata_keys_and_values_are_bounded_and_no_error_echoes_a_key(api: FilesApi) -> None:
    async def create(metadata: dict[str, str]) -> httpx.Response:
        body = {"input_file_id": "file_x", "endpoint": "/v1/embeddings", "completion_window": "24h"}
        return await api.http.post(
            "/v1/batches", json={**body, "metadata": metadata}, headers=bearer(api.key)
        )

    long_key = "k" * 65
    error = assert_error(await create({long_key: "v"}), 400, param="metadata")
    assert "64 characters" in error["message"] and long_key not in json.dumps(error)
    assert_error(await create({"k": "v" * 513}), 400, param="metadata.k")
    assert_error(await create({"k" * 64: "v" * 512}), 404, "file_not_found")  # within the bounds


async def test_an_upload_below_the_free_disk_floor_is_507_before_a_byte_is_stored(api: FilesApi) -> None:
    settings = api.services.settings
    floor = settings.min_free_disk_mb
    settings.min_free_disk_mb = 1 << 40  # far more than any disk has
    try:
        error = assert_error(await upload(api, jsonl(line())), 507, "insufficient_storage")
        assert "MODELHOST_MIN_FREE_DISK_MB" in error["message"], error
        assert stored_files(api) == []
    finally:
        settings.min_free_disk_mb = floor
    assert (await upload(api, jsonl(line()))).status_code == 200


async def test_an_account_out_of_credits_cannot_upload_but_may_read_and_delete_its_files(
    api: FilesApi,
) -> None:
    account = await new_account(api.http, name="spent", credits=1)
    key = account["api_key"]
    kept = (await upload(api, jsonl(line()), key=key)).json()["id"]
    spent = await api.http.post(
        f"/v1/admin/accounts/{account['id']}/credits", json={"credits": -1}, headers=bearer(ADMIN_KEY)
    )
    assert spent.status_code == 200 and spent.json()["credits"] == 0, spent.text
    assert_error(await upload(api, jsonl(line()), key=key), 402, "insufficient_credits")
    assert (await api.http.get(f"/v1/files/{kept}/content", headers=bearer(key))).content == jsonl(line())
    assert (await api.http.delete(f"/v1/files/{kept}", headers=bearer(key))).status_code == 200


async def test_files_requests_count_against_the_keys_rate_limits(api: FilesApi) -> None:
    made = await api.http.post(
        "/v1/keys", json={"name": "slow", "limits": {"requests_per_minute": 2}}, headers=bearer(api.key)
    )
    key = made.json()["api_key"]
    uploaded = await upload(api, jsonl(line()), key=key)
    assert uploaded.status_code == 200 and uploaded.headers["x-ratelimit-remaining-requests"] == "1"
    assert (await api.http.get("/v1/files", headers=bearer(key))).status_code == 200
    for refused in (
        await upload(api, jsonl(line()), key=key),
        await api.http.get(f"/v1/files/{uploaded.json()['id']}/content", headers=bearer(key)),
    ):
        assert_error(refused, 429, "rate_limit_exceeded")
        assert int(refused.headers["retry-after"]) >= 1


async def test_creating_a_batch_counts_against_the_keys_rate_limits_but_polling_it_does_not(
    api: FilesApi,
) -> None:
    made = await api.http.post(
        "/v1/keys", json={"name": "batchy", "limits": {"requests_per_minute": 1}}, headers=bearer(api.key)
    )
    key = bearer(made.json()["api_key"])
    file_id = (await upload(api, jsonl(line()))).json()["id"]
    body = {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
    created = await api.http.post("/v1/batches", json=body, headers=key)
    assert created.status_code == 200 and created.headers["x-ratelimit-remaining-requests"] == "0"
    for _ in range(3):  # a client polls its batch until it ends
        assert (await api.http.get(f"/v1/batches/{created.json()['id']}", headers=key)).status_code == 200
    assert_error(await api.http.post("/v1/batches", json=body, headers=key), 429, "rate_limit_exceeded")


async def test_an_uploaded_file_is_billed_as_storage_until_it_is_deleted(api: FilesApi) -> None:
    account = await new_account(api.http, name="stored")
    key = account["api_key"]
    file_id = (await upload(api, b"x" * 1_000_000, purpose="user_data", key=key)).json()["id"]

    async def stored_credits() -> dict[str, str]:
        await api.services.billing.tick_and_enforce(api.services.manager.unload_account)
        usage = (await api.http.get("/v1/usage", headers=bearer(key))).json()
        return {line["artifact_id"]: line["storage_credits"] for line in usage["by_artifact"]}

    api.clock.advance(3600)
    assert await stored_credits() == {file_id: 0.0036}  # 1 MB for an hour at 1,000 micro-credits per GB-s
    assert (await api.http.delete(f"/v1/files/{file_id}", headers=bearer(key))).status_code == 200
    api.clock.advance(3600)
    assert await stored_credits() == {file_id: 0.0036}  # nothing more once deleted


def test_an_upload_and_its_download_stream_in_bounded_memory_and_read_back_byte_identical(
    api: FilesApi,
) -> None:
    """Over a real socket: neither the 64 MB upload nor its download is held whole by the server."""
    block = os.urandom(MB)
    size = 64 * MB
    sent = hashlib.sha256()

    def body() -> Iterator[bytes]:
        yield form_head("user_data", "blob.bin")
        for index in range(size // MB):
            chunk = block[index:] + block[:index]
            sent.update(chunk)
            yield chunk
        yield form_tail()

    with live_server(api.services.settings, api.app) as url, httpx.Client(base_url=url, timeout=120) as http:
        with memory_growth() as upload_growth:
            uploaded = http.post("/v1/files", content=body(), headers={**FORM, **bearer(api.key)})
        assert uploaded.status_code == 200, uploaded.text
        assert uploaded.json()["bytes"] == size
        file_id = uploaded.json()["id"]
        received = hashlib.sha256()
        content = f"/v1/files/{file_id}/content"
        with (
            memory_growth() as download_growth,
            http.stream("GET", content, headers=bearer(api.key)) as download,
        ):
            assert download.status_code == 200
            for chunk in download.iter_bytes():
                received.update(chunk)
        assert received.hexdigest() == sent.hexdigest()
        assert download.headers["content-length"] == str(size)
        assert download.headers["content-disposition"] == 'attachment; filename="blob.bin"'
        assert download.headers["content-type"] == "application/octet-stream"
        assert http.delete(f"/v1/files/{file_id}", headers=bearer(api.key)).status_code == 200
    for what, growth in (("upload", upload_growth), ("download", download_growth)):
        assert growth.bytes < 24 * MB, f"the {what} raised memory by {growth.bytes / MB:.1f} MB"
    print(f"memory: upload +{upload_growth.bytes / MB:.1f} MB, download +{download_growth.bytes / MB:.1f} MB")


async def test_a_files_expiry_is_its_creation_plus_the_seconds_asked_however_long_the_upload_took(
    api: FilesApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`expires_at` is `created_at` plus `expires_after[seconds]` exactly, even when the clock moves on
    between the bytes' arrival and the row (a second boundary crossed meanwhile made them differ)."""
    import modelhost.batches.files as stored_files

    readings = itertools.count()
    monkeypatch.setattr(
        stored_files, "utcnow", lambda: utcnow() + timedelta(seconds=7 * (1 + next(readings)))
    )
    answer = await api.http.post(
        "/v1/files",
        files={"file": ("notes.txt", b"hello")},
        data={
            "purpose": "user_data",
            "expires_after[anchor]": "created_at",
            "expires_after[seconds]": "3600",
        },
        headers=bearer(api.key),
    )
    assert answer.status_code == 200, answer.text
    made = answer.json()
    assert made["expires_at"] == made["created_at"] + 3600
