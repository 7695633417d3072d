"""The S3 blob store: the same contract as the local one, proven against moto's S3 server.

The contract tests run on both stores; the S3-only tests cover what only S3 can get wrong (key
prefix, the local mirror, batched deletes, a half-done move), and one end-to-end test serves
embeddings from a model uploaded into the bucket.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from pydantic import ValidationError

from modelhost.api.app import create_app
from modelhost.artifacts.blobstore import BlobStore, LocalBlobStore
from modelhost.artifacts.s3 import S3BlobStore
from modelhost.container import Services
from tests.conftest import S3_REGION as REGION
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, bearer, push_folder


@pytest.fixture
def s3(s3_endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name=REGION)


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"blobs-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_store(s3: Any, bucket: str, tmp_path: Path) -> S3BlobStore:
    return S3BlobStore(s3, bucket, tmp_path / "cache", key_prefix="mh/")


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "local":
        return LocalBlobStore(tmp_path / "blobs")
    s3_store: S3BlobStore = request.getfixturevalue("s3_store")
    return s3_store


def put(store: BlobStore, key: str, data: bytes) -> None:
    writer = store.writer(key)
    writer.write(data)
    writer.commit()


def keys(store: BlobStore, prefix: str) -> list[str]:
    return [b.key for b in store.list(prefix)]


# ---------------------------------------------------------------- the contract, on both stores


def test_a_committed_blob_is_listed_readable_by_range_and_openable(store: BlobStore) -> None:
    writer = store.writer("staging/u1/weights/model.bin")
    writer.write(b"hello ")
    writer.write(b"world")
    assert (writer.size, writer.hexdigest()) == (11, hashlib.sha256(b"hello world").hexdigest())
    writer.commit()
    assert [(b.key, b.size) for b in store.list("staging/u1")] == [("staging/u1/weights/model.bin", 11)]
    assert store.exists("staging/u1") and store.exists("staging/u1/weights/model.bin")
    assert not store.exists("staging/u2")
    assert store.read_range("staging/u1/weights/model.bin", 6, 5) == b"world"
    with store.open("staging/u1/weights/model.bin") as handle:
        assert handle.read() == b"hello world"


def test_an_aborted_write_leaves_nothing(store: BlobStore) -> None:
    writer = store.writer("staging/u1/config.json")
    writer.write(b"{}")
    writer.abort()
    assert keys(store, "staging") == []
    assert not store.exists("staging/u1/config.json")


def test_opening_a_missing_blob_raises_file_not_found(store: BlobStore) -> None:
    with pytest.raises(FileNotFoundError):
        store.open("files/nothing.png")


def test_moving_a_prefix_moves_every_blob_and_empties_the_source(store: BlobStore) -> None:
    put(store, "staging/u1/config.json", b"{}")
    put(store, "staging/u1/1_Pooling/config.json", b"[]")
    store.move_prefix("staging/u1", "artifacts/a1/u1")
    assert keys(store, "artifacts/a1/u1") == [
        "artifacts/a1/u1/1_Pooling/config.json",
        "artifacts/a1/u1/config.json",
    ]
    assert store.read_range("artifacts/a1/u1/1_Pooling/config.json", 0, 10) == b"[]"
    assert not store.exists("staging/u1")


def test_deleting_a_prefix_spares_keys_that_only_start_with_its_name(store: BlobStore) -> None:
    put(store, "videos/ab/content", b"1")
    put(store, "videos/abc/content", b"2")
    put(store, "videos/ab-reference", b"3")
    store.delete_prefix("videos/ab")
    assert keys(store, "videos") == ["videos/ab-reference", "videos/abc/content"]


def test_deleting_a_single_blob_by_its_key(store: BlobStore) -> None:
    put(store, "files/x.png", b"png")
    put(store, "files/y.png", b"png")
    store.delete_prefix("files/x.png")
    assert keys(store, "files") == ["files/y.png"]


def test_local_dir_holds_the_same_files_and_bytes(store: BlobStore) -> None:
    files = {
        "config.json": b"{}",
        "1_Pooling/config.json": b"[1]",
        "a/b/c/weights.bin": bytes(range(256)) * 40,
    }
    for name, data in files.items():
        put(store, f"artifacts/a1/v1/{name}", data)
    folder = store.local_dir("artifacts/a1/v1")
    found = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert found == files


def test_a_file_cannot_be_written_where_a_folder_is_or_under_a_file(store: BlobStore) -> None:
    put(store, "staging/u1/a/b", b"1")
    with pytest.raises((IsADirectoryError, NotADirectoryError, FileExistsError)):
        put(store, "staging/u1/a", b"2")
    with pytest.raises((IsADirectoryError, NotADirectoryError, FileExistsError)):
        put(store, "staging/u1/a/b/c", b"3")
    assert keys(store, "staging/u1") == ["staging/u1/a/b"]


# ---------------------------------------------------------------- what only S3 can get wrong


def test_keys_are_objects_under_the_key_prefix(s3_store: S3BlobStore, s3: Any, bucket: str) -> None:
    put(s3_store, "files/x.png", b"png")
    listed = s3.list_objects_v2(Bucket=bucket)["Contents"]
    assert [o["Key"] for o in listed] == ["mh/files/x.png"]


def test_an_unfinished_move_hides_the_target_until_every_copy_is_done(
    s3_store: S3BlobStore, s3: Any, bucket: str
) -> None:
    put(s3_store, "artifacts/a1/u1/config.json", b"{}")
    s3.put_object(Bucket=bucket, Key="mh/artifacts/a1/u1/.modelhost-partial/moving", Body=b"")
    assert s3_store.list("artifacts/a1/u1") == []
    s3.delete_object(Bucket=bucket, Key="mh/artifacts/a1/u1/.modelhost-partial/moving")
    assert keys(s3_store, "artifacts/a1/u1") == ["artifacts/a1/u1/config.json"]


def test_local_dir_fetches_a_rewritten_file_again(s3_store: S3BlobStore) -> None:
    put(s3_store, "staging/u1/config.json", b"{a}")
    assert (s3_store.local_dir("staging/u1") / "config.json").read_bytes() == b"{a}"
    put(s3_store, "staging/u1/config.json", b"{b}")
    assert (s3_store.local_dir("staging/u1") / "config.json").read_bytes() == b"{b}"


def test_a_moved_prefix_keeps_its_local_mirror_instead_of_downloading_again(s3_store: S3BlobStore) -> None:
    put(s3_store, "staging/u1/config.json", b"{}")
    inspected = (s3_store.local_dir("staging/u1") / "config.json").stat().st_ino
    s3_store.move_prefix("staging/u1", "artifacts/a1/u1")
    served = s3_store.local_dir("artifacts/a1/u1") / "config.json"
    assert (served.stat().st_ino, served.read_bytes()) == (inspected, b"{}")
    assert not (s3_store.cache_root / "staging" / "u1").exists()


class CountingClient:
    """The boto3 client, counting DeleteObjects requests."""

    def __init__(self, client: Any) -> None:
        self.client, self.deletes = client, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def delete_objects(self, **request: Any) -> Any:
        self.deletes += 1
        return self.client.delete_objects(**request)


def test_deleting_a_prefix_sends_its_keys_in_batches(
    s3: Any, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("modelhost.artifacts.s3.DELETE_BATCH", 2)  # S3's limit is 1000 keys a request
    counting = CountingClient(s3)
    store = S3BlobStore(counting, bucket, tmp_path / "cache")
    for i in range(5):
        put(store, f"videos/v1/{i}", b"")
    store.delete_prefix("videos/v1")
    assert (counting.deletes, store.exists("videos/v1")) == (3, False)


def test_s3_blob_store_without_a_bucket_is_refused(tmp_path: Path, sqlite_url: str) -> None:
    with pytest.raises(ValidationError, match="MODELHOST_S3_BUCKET"):
        make_settings(tmp_path, sqlite_url, blob_store="s3")


# ---------------------------------------------------------------- end to end


async def test_a_model_uploaded_into_the_bucket_serves_embeddings(
    tmp_path: Path, sqlite_url: str, recipes: Path, s3: Any, bucket: str, s3_endpoint: str
) -> None:
    settings = make_settings(
        tmp_path, sqlite_url, blob_store="s3", s3_bucket=bucket, s3_endpoint_url=s3_endpoint, worker_threads=1
    )
    services = Services.build(settings)
    transport = httpx.ASGITransport(app=create_app(services=services), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://modelhost.test") as client:
        await services.manager.start()
        try:
            made = await client.post("/v1/admin/accounts", json={"name": "a"}, headers=bearer(ADMIN_KEY))
            key = made.json()["api_key"]
            pushed = await push_folder(
                client, key, recipes / "t03_feature_extraction" / "st", "feature-extraction"
            )
            artifact = pushed["artifact"]
            assert artifact["status"] == "ready", pushed
            objects = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
            assert any(
                k.startswith(f"artifacts/{artifact['id']}/") and k.endswith("config.json") for k in objects
            )
            assert not any(k.startswith("staging/") for k in objects)
            deployed = await client.post(
                "/v1/deployments", json={"model": "m", "artifact_id": artifact["id"]}, headers=bearer(key)
            )
            assert deployed.status_code == 201, deployed.text
            embedded = await asyncio.wait_for(
                client.post("/v1/embeddings", json={"model": "m", "input": "hello"}, headers=bearer(key)), 120
            )
            assert embedded.status_code == 200, embedded.text
            # the worker loaded the files mirrored from the bucket
            assert (tmp_path / "data" / "blob-cache" / "artifacts" / artifact["id"]).is_dir()
            assert len(embedded.json()["data"][0]["embedding"]) > 0
        finally:
            await services.manager.shutdown()
            services.close()
