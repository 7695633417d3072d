"""Upload sessions: bad input, checksums, limits, foreign IDs, completion rules, abort, expiry, re-upload."""

from __future__ import annotations

import hashlib
import tracemalloc
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelhost.api.app import create_app
from modelhost.container import Services
from modelhost.store.models import ModelArtifact
from modelhost.store.types import utcnow
from tests.conftest import make_settings
from tests.helpers import assert_error, bearer, new_account, push_folder


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    """Session edge cases are database-independent; SQLite keeps them fast."""
    return sqlite_url


Json = dict[str, Any]


class Upload:
    """One open upload session of a fresh artifact, driven over HTTP."""

    def __init__(self, client: httpx.AsyncClient, key: str, artifact: Json, upload_id: str) -> None:
        self.client, self.key, self.artifact, self.upload_id = client, key, artifact, upload_id
        self.base = f"/v1/model-artifacts/{artifact['id']}/uploads/{upload_id}"

    async def put(self, path: str, data: bytes, **headers: str) -> httpx.Response:
        return await self.client.put(
            f"{self.base}/files/{path}", content=data, headers={**bearer(self.key), **headers}
        )

    async def show(self) -> Json:
        body: Json = (await self.client.get(self.base, headers=bearer(self.key))).json()
        return body

    async def complete(self) -> httpx.Response:
        return await self.client.post(f"{self.base}/complete", headers=bearer(self.key))

    async def abort(self) -> httpx.Response:
        return await self.client.delete(self.base, headers=bearer(self.key))

    async def artifact_now(self) -> Json:
        url = f"/v1/model-artifacts/{self.artifact['id']}"
        body: Json = (await self.client.get(url, headers=bearer(self.key))).json()
        return body


async def open_upload(client: httpx.AsyncClient, key: str, pipeline: str = "fill-mask") -> Upload:
    artifact = (
        await client.post(
            "/v1/model-artifacts", json={"display_name": "m", "pipeline": pipeline}, headers=bearer(key)
        )
    ).json()
    started = (await client.post(f"/v1/model-artifacts/{artifact['id']}/uploads", headers=bearer(key))).json()
    assert set(started) == {"upload_id", "message", "artifact"}
    assert started["artifact"]["status"] == "ingesting"
    return Upload(client, key, artifact, started["upload_id"])


@pytest.fixture
async def upload(client: httpx.AsyncClient) -> Upload:
    return await open_upload(client, (await new_account(client))["api_key"])


async def test_put_records_path_size_and_sha256(upload: Upload) -> None:
    data = b"hello artifact"
    response = await upload.put("sub/dir/file.txt", data)
    assert response.json() == {
        "path": "sub/dir/file.txt",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    shown = await upload.show()
    assert shown["status"] == "open" and shown["files"] == [response.json()]
    assert shown["expires_at"] > shown["created_at"]


async def test_put_again_replaces_the_file(upload: Upload) -> None:
    await upload.put("a.txt", b"one")
    await upload.put("a.txt", b"second")
    assert [(f["path"], f["size"]) for f in (await upload.show())["files"]] == [("a.txt", 6)]


async def test_matching_checksum_is_accepted_and_a_mismatch_is_refused(upload: Upload) -> None:
    good = await upload.put("a.bin", b"abc", **{"X-Content-SHA256": hashlib.sha256(b"abc").hexdigest()})
    assert good.status_code == 200
    bad = await upload.put("b.bin", b"abc", **{"X-Content-SHA256": "0" * 64})
    assert assert_error(bad, 400, "checksum_mismatch")["param"] == "X-Content-SHA256"
    malformed = await upload.put("c.bin", b"abc", **{"X-Content-SHA256": "xyz"})
    assert_error(malformed, 400, "invalid_request")
    assert [f["path"] for f in (await upload.show())["files"]] == ["a.bin"]


@pytest.mark.parametrize(
    "raw_path",
    [
        "..%2Fescape.txt",
        "a/%2E%2E/%2E%2E/escape.txt",
        "%2Fetc%2Fpasswd",
        "dir%5Cfile.txt",
        "nul%00byte",
        "ctrl%01char",
        "x" * 300,
        "a//b",
        "%2E/a",
        ".modelhost-partial/x",
    ],
)
async def test_unsafe_paths_are_refused(upload: Upload, raw_path: str) -> None:
    response = await upload.client.put(
        httpx.URL(upload.base + "/files/" + raw_path), content=b"x", headers=bearer(upload.key)
    )
    assert response.status_code in (400, 404), response.text
    assert_error(response, response.status_code)
    assert (await upload.show())["files"] == []


async def test_file_over_the_size_limit_is_413_and_not_recorded(tmp_path: Path, sqlite_url: str) -> None:
    services = Services.build(make_settings(tmp_path, sqlite_url, max_upload_file_bytes=1000))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(services=services)), base_url="http://t"
    ) as http:
        up = await open_upload(http, (await new_account(http))["api_key"])

        async def body() -> AsyncIterator[bytes]:
            for _ in range(5):
                yield b"x" * 300

        assert_error(await up.put("big.bin", b"x" * 1001), 413, "payload_too_large")
        streamed = await http.put(f"{up.base}/files/big.bin", content=body(), headers=bearer(up.key))
        assert_error(streamed, 413, "payload_too_large")
        assert (await up.put("small.bin", b"x" * 1000)).status_code == 200
        assert [f["path"] for f in (await up.show())["files"]] == ["small.bin"]
    services.close()


async def test_unknown_or_foreign_upload_ids_are_404(client: httpx.AsyncClient) -> None:
    key = (await new_account(client, "a"))["api_key"]
    first = await open_upload(client, key)
    second = await open_upload(client, key)
    wrong_base = f"/v1/model-artifacts/{first.artifact['id']}/uploads/{second.upload_id}"
    assert_error(await client.get(wrong_base, headers=bearer(key)), 404, "upload_not_found")
    assert_error(
        await client.put(wrong_base + "/files/a", content=b"x", headers=bearer(key)), 404, "upload_not_found"
    )
    assert_error(await client.post(wrong_base + "/complete", headers=bearer(key)), 404, "upload_not_found")
    unknown = f"/v1/model-artifacts/{first.artifact['id']}/uploads/upl_nope"
    assert_error(await client.get(unknown, headers=bearer(key)), 404, "upload_not_found")


async def test_another_accounts_artifact_is_404_everywhere(client: httpx.AsyncClient) -> None:
    mine = await open_upload(client, (await new_account(client, "a"))["api_key"])
    other = bearer((await new_account(client, "b"))["api_key"])
    art = f"/v1/model-artifacts/{mine.artifact['id']}"
    for method, path in [
        ("GET", art),
        ("DELETE", art),
        ("POST", f"{art}/uploads"),
        ("GET", mine.base),
        ("PUT", f"{mine.base}/files/a"),
        ("POST", f"{mine.base}/complete"),
        ("DELETE", mine.base),
    ]:
        response = await client.request(
            method, path, content=b"x" if method == "PUT" else None, headers=other
        )
        assert_error(response, 404, "artifact_not_found")
    assert (await mine.show())["status"] == "open"


async def test_completing_twice_and_uploading_after_completion_are_409(upload: Upload, recipes: Path) -> None:
    folder = recipes / "t02_fill_mask"
    for file in folder.iterdir():
        await upload.put(file.name, file.read_bytes())
    assert (await upload.complete()).json()["artifact"]["status"] == "ready"
    assert_error(await upload.complete(), 409, "upload_not_open")
    assert_error(await upload.put("late.txt", b"x"), 409, "upload_not_open")
    assert_error(await upload.abort(), 409, "upload_not_open")
    assert (await upload.show())["status"] == "completed"


async def test_abort_returns_the_artifact_to_its_previous_state(upload: Upload, services: Services) -> None:
    await upload.put("config.json", b"{}")
    aborted = await upload.abort()
    assert aborted.json()["artifact"]["status"] == "created"
    assert (await upload.show())["status"] == "aborted"
    assert_error(await upload.put("x", b"x"), 409, "upload_not_open")
    assert not services.blobs.exists(f"staging/{upload.upload_id}")


async def test_expired_sessions_are_swept(upload: Upload, services: Services) -> None:
    await upload.put("config.json", b"{}")
    assert services.artifacts.sweep(now=utcnow() + timedelta(days=2)) == 1
    assert (await upload.show())["status"] == "expired"
    assert (await upload.artifact_now())["status"] == "created"
    assert not services.blobs.exists(f"staging/{upload.upload_id}")
    assert_error(await upload.complete(), 409, "upload_not_open")


async def test_reupload_keeps_old_files_until_the_new_ones_are_ready(
    client: httpx.AsyncClient, services: Services, recipes: Path, tmp_path: Path
) -> None:
    key = (await new_account(client))["api_key"]
    first = (await push_folder(client, key, recipes / "t02_fill_mask", "fill-mask"))["artifact"]
    artifact_id = first["id"]

    def served() -> list[str]:
        with services.database.transaction() as session:
            row = session.get(ModelArtifact, artifact_id)
            assert row is not None
        prefix = services.artifacts.files_dir(row)
        assert prefix is not None
        return [b.key for b in services.blobs.list(prefix)]

    old_files = served()
    started = (await client.post(f"/v1/model-artifacts/{artifact_id}/uploads", headers=bearer(key))).json()
    base = f"/v1/model-artifacts/{artifact_id}/uploads/{started['upload_id']}"
    await client.put(f"{base}/files/config.json", content=b"{broken", headers=bearer(key))
    assert served() == old_files  # still the old version while ingesting
    failed = (await client.post(f"{base}/complete", headers=bearer(key))).json()
    assert failed["artifact"]["status"] == "ready"  # previous version stays ready
    assert failed["artifact"]["error"]["code"] == "invalid_config"
    assert "previous version stays ready" in failed["message"]
    assert served() == old_files
    replaced = (await push_again(client, key, artifact_id, recipes / "t02_fill_mask"))["artifact"]
    assert replaced["status"] == "ready" and replaced["error"] is None
    new_files = served()
    assert new_files != old_files
    assert not any(services.blobs.exists(k) for k in old_files)


async def push_again(client: httpx.AsyncClient, key: str, artifact_id: str, folder: Path) -> Json:
    started = (await client.post(f"/v1/model-artifacts/{artifact_id}/uploads", headers=bearer(key))).json()
    base = f"/v1/model-artifacts/{artifact_id}/uploads/{started['upload_id']}"
    for file in sorted(folder.iterdir()):
        await client.put(f"{base}/files/{file.name}", content=file.read_bytes(), headers=bearer(key))
    body: Json = (await client.post(f"{base}/complete", headers=bearer(key))).json()
    return body


async def test_uploads_are_streamed_not_held_in_memory(services: Services, client: httpx.AsyncClient) -> None:
    account = await new_account(client)
    artifact = services.artifacts.create(account["id"], "big", "fill-mask").artifact
    upload, _ = services.artifacts.start_upload(account["id"], artifact.id)
    total = 64 * 1024 * 1024

    async def chunks() -> AsyncIterator[bytes]:
        block = b"\x01" * 65536
        for _ in range(total // len(block)):
            yield block

    tracemalloc.start()
    record = await services.artifacts.put_file(
        account["id"], artifact.id, upload.id, "big.bin", chunks(), None
    )
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert record.size == total
    assert peak < 8 * 1024 * 1024, peak
