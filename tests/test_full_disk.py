"""A full disk (issue 28): a 507 naming the store, nothing half-written, and recovery once space is freed.

The data directory is a small tmpfs (we mount it: root only) that a test fills with one preallocated
file, leaving as many bytes free as it wants; deleting that file frees the space again.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelhost.artifacts.disk import DATA_DIR_FREE_BYTES
from modelhost.config import Settings
from modelhost.store.db import database_full
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer, push_folder_sync
from tests.live import live_server

DISK_MB = 16
MB = 1024 * 1024


# ---------------------------------------------------------------- the disk and its filler


class SmallDisk:
    """A tmpfs of DISK_MB: `fill(leave)` takes its free space but `leave` bytes; `free()` gives it back."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self._filler = root / "filler"

    def free_bytes(self) -> int:
        stats = os.statvfs(self.root)
        return stats.f_bavail * stats.f_frsize

    def fill(self, leave: int = 0) -> None:
        """The server writes meanwhile (its database's journal, heartbeats): what was free a moment ago
        may no longer be, so a filler that finds no room is measured again and tried once more."""
        self.free()
        fd = os.open(self._filler, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            for attempt in range(5):
                try:
                    os.posix_fallocate(fd, 0, os.fstat(fd).st_size + self.free_bytes() - leave)
                    return
                except OSError as exc:
                    if exc.errno != errno.ENOSPC or attempt == 4:
                        raise
        finally:
            os.close(fd)

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    root = tmp_path / "disk"
    root.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(root)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {mounted.stderr.strip()}")
    try:
        yield SmallDisk(root)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def disk_settings(
    disk: SmallDisk, tmp_path: Path, database_on_disk: bool = False, **overrides: Any
) -> Settings:
    """Data directory on the small disk; the SQLite file beside it only when the test is about it."""
    database = disk.root / "data" / "modelhost.db" if database_on_disk else tmp_path / "db.sqlite"
    settings = make_settings(tmp_path, f"sqlite:///{database}", worker_threads=1, **overrides)
    settings.data_dir = disk.data
    return settings


def new_key(http: httpx.Client) -> str:
    created = http.post("/v1/admin/accounts", json={"name": "acme"}, headers=bearer(ADMIN_KEY))
    assert created.status_code == 201, created.text
    key: str = created.json()["api_key"]
    return key


def open_upload(http: httpx.Client, key: str, pipeline: str = "feature-extraction") -> tuple[str, str]:
    """A new artifact with an open upload session: (artifact id, the session's URL path)."""
    artifact = http.post(
        "/v1/model-artifacts", json={"display_name": "m", "pipeline": pipeline}, headers=bearer(key)
    ).json()
    started = http.post(f"/v1/model-artifacts/{artifact['id']}/uploads", headers=bearer(key))
    assert started.status_code == 201, started.text
    return artifact["id"], f"/v1/model-artifacts/{artifact['id']}/uploads/{started.json()['upload_id']}"


def deploy_embedder(http: httpx.Client, key: str, recipes: Path) -> Callable[[], None]:
    """Push and deploy the tiny feature-extraction model; returns a call that embeds once and checks 200."""
    artifact = push_folder_sync(http, key, recipes / "t03_feature_extraction" / "hf", "feature-extraction")
    body = {"model": "embedder", "artifact_id": artifact}
    deployed = http.post("/v1/deployments", json=body, headers=bearer(key))
    assert deployed.status_code == 201, deployed.text

    def embed() -> None:
        answer = http.post("/v1/embeddings", json={"model": "embedder", "input": "hi"}, headers=bearer(key))
        assert answer.status_code == 200, answer.text

    return embed


def streamed(data: bytes, chunk: int = 16 * 1024) -> Iterator[bytes]:
    """A body without `Content-Length` (chunked): the server learns its size only by writing it."""
    for start in range(0, len(data), chunk):
        yield data[start : start + chunk]


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


# ---------------------------------------------------------------- uploads


def test_an_upload_into_a_full_disk_is_a_507_publishes_nothing_and_the_retry_after_freeing_space_succeeds(
    disk: SmallDisk, tmp_path: Path, recipes: Path
) -> None:
    model = recipes / "t03_feature_extraction" / "hf"
    weights = (model / "model.safetensors").read_bytes()
    with (
        live_server(disk_settings(disk, tmp_path, min_free_disk_mb=0)) as url,
        httpx.Client(base_url=url, timeout=120) as http,
    ):
        key = new_key(http)
        embed = deploy_embedder(http, key, recipes)
        embed()
        artifact_id, base = open_upload(http, key)
        small_files = ["config.json", "tokenizer.json", "tokenizer_config.json"]
        for name in small_files:
            put = http.put(f"{base}/files/{name}", content=(model / name).read_bytes(), headers=bearer(key))
            assert put.status_code == 200, put.text

        disk.fill(leave=len(weights) // 2)
        refused = http.put(f"{base}/files/model.safetensors", content=streamed(weights), headers=bearer(key))
        error = assert_error(refused, 507, "insufficient_storage", "insufficient_storage_error")
        assert "blob store" in error["message"] and "uploaded file" in error["message"], error
        staging = disk.data / "blobs" / "staging" / base.rsplit("/", 1)[1]
        assert files_under(staging) == small_files  # no partial file, in `.modelhost-partial` or elsewhere
        session = http.get(base, headers=bearer(key)).json()
        assert session["status"] == "open" and [f["path"] for f in session["files"]] == small_files
        artifact = http.get(f"/v1/model-artifacts/{artifact_id}", headers=bearer(key)).json()
        assert artifact["status"] == "ingesting", artifact
        embed()  # the deployed model needs no disk: it keeps serving

        disk.free()
        freed = time.monotonic()
        retried = http.put(f"{base}/files/model.safetensors", content=streamed(weights), headers=bearer(key))
        assert retried.status_code == 200, retried.text
        completed = http.post(f"{base}/complete", headers=bearer(key))
        assert completed.status_code == 200, completed.text
        assert completed.json()["artifact"]["status"] == "ready", completed.text
        print(f"ready {time.monotonic() - freed:.3f} s after the space was freed")
        embed()


def test_an_upload_below_the_floor_is_refused_up_front_and_one_that_fits_is_not(
    disk: SmallDisk, tmp_path: Path
) -> None:
    with (
        live_server(disk_settings(disk, tmp_path, min_free_disk_mb=4)) as url,
        httpx.Client(base_url=url, timeout=60) as http,
    ):
        key = new_key(http)
        _, base = open_upload(http, key)
        disk.fill(leave=6 * MB)
        too_big = http.put(f"{base}/files/big.txt", content=b"x" * (3 * MB), headers=bearer(key))
        error = assert_error(too_big, 507, "insufficient_storage")
        assert "this file needs 3.0 MB" in error["message"] and "leave 4.0 MB free" in error["message"], error
        fits = http.put(f"{base}/files/small.txt", content=b"x" * MB, headers=bearer(key))
        assert fits.status_code == 200, fits.text

        disk.fill(leave=3 * MB)  # below the floor: even an empty file, even one of unknown size
        for body in (b"", streamed(b"x" * 1024)):
            assert_error(http.put(f"{base}/files/tiny.txt", content=body, headers=bearer(key)), 507)
        staging = disk.data / "blobs" / "staging" / base.rsplit("/", 1)[1]
        assert files_under(staging) == ["small.txt"]

        disk.free()
        assert http.put(f"{base}/files/tiny.txt", content=b"x", headers=bearer(key)).status_code == 200


def test_ready_and_the_metric_show_the_free_space_against_the_floor(disk: SmallDisk, tmp_path: Path) -> None:
    with (
        live_server(disk_settings(disk, tmp_path, min_free_disk_mb=4)) as url,
        httpx.Client(base_url=url, timeout=60) as http,
    ):
        ready = http.get("/ready")
        assert ready.status_code == 200 and ready.json()["disk"] == "ok", ready.text
        assert ready.json()["disk_floor_bytes"] == 4 * MB

        disk.fill(leave=2 * MB)
        low = http.get("/ready")
        assert low.status_code == 200, low.text  # inference needs no disk: stay in the load balancer
        body = low.json()
        assert body["status"] == "ready" and body["disk"] == "low", body
        assert abs(body["disk_free_bytes"] - disk.free_bytes()) < 256 * 1024, body
        metric(http.get("/metrics").text, "modelhost_data_dir_free_bytes")  # exposed, and measured now
        # this process's own value: the scrape shows the most recent of every process of the test session
        # (another test's server, measuring another disk, may have written it a moment later)
        (own,) = DATA_DIR_FREE_BYTES.collect()[0].samples
        assert abs(own.value - disk.free_bytes()) < 256 * 1024, own

        disk.free()
        assert http.get("/ready").json()["disk"] == "ok"
        assert metric(http.get("/metrics").text, "modelhost_data_dir_free_bytes") > 10 * MB


def metric(exposition: str, name: str) -> float:
    for line in exposition.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


# ---------------------------------------------------------------- the database


def test_postgres_disk_full_is_told_apart_from_other_database_errors() -> None:
    from psycopg import errors as pg
    from sqlalchemy.exc import OperationalError

    assert database_full(OperationalError("INSERT ...", {}, pg.DiskFull("could not extend file")))
    assert not database_full(OperationalError("INSERT ...", {}, pg.QueryCanceled("canceling statement")))
    assert not database_full(ValueError("database or disk is full"))  # only a driver's error counts


def test_a_write_to_a_sqlite_database_on_a_full_disk_is_a_507_and_succeeds_once_space_is_freed(
    disk: SmallDisk, tmp_path: Path, recipes: Path
) -> None:
    settings = disk_settings(disk, tmp_path, database_on_disk=True, min_free_disk_mb=0)
    with live_server(settings) as url, httpx.Client(base_url=url, timeout=120) as http:
        key = new_key(http)
        embedder = deploy_embedder(http, key, recipes)
        embedder()
        # The WAL reuses its own pages after a checkpoint: empty it, so the next write needs new space.
        with sqlite3.connect(disk.data / "modelhost.db") as connection:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        disk.fill()

        refused = http.post("/v1/keys", json={"name": "ci"}, headers=bearer(key))
        error = assert_error(refused, 507, "insufficient_storage", "insufficient_storage_error")
        assert "database is full" in error["message"], error
        assert http.get("/ready").status_code == 200  # reads still work
        embedder()  # and so does inference

        disk.free()
        created = http.post("/v1/keys", json={"name": "ci"}, headers=bearer(key))
        assert created.status_code == 201, created.text


# ---------------------------------------------------------------- generated files


def test_an_image_url_answer_into_a_full_disk_is_a_507_while_b64_answers_go_on(
    disk: SmallDisk, tmp_path: Path, recipes: Path
) -> None:
    with (
        live_server(disk_settings(disk, tmp_path, min_free_disk_mb=0)) as url,
        httpx.Client(base_url=url, timeout=120) as http,
    ):
        key = new_key(http)
        artifact = push_folder_sync(http, key, recipes / "t13_diffusers_sd", "text-to-image")
        deployed = http.post(
            "/v1/deployments", json={"model": "painter", "artifact_id": artifact}, headers=bearer(key)
        )
        assert deployed.status_code == 201, deployed.text

        def generate(response_format: str) -> httpx.Response:
            body = {"model": "painter", "prompt": "a fox", "num_inference_steps": 1}
            return http.post(
                "/v1/images/generations",
                json={**body, "response_format": response_format},
                headers=bearer(key),
            )

        assert generate("b64_json").status_code == 200  # loaded before the disk fills
        disk.fill()
        error = assert_error(generate("url"), 507, "insufficient_storage")
        assert "blob store" in error["message"] and "generated file" in error["message"], error
        assert files_under(disk.data / "blobs" / "generated") == []
        assert generate("b64_json").status_code == 200, "inference needs no disk"

        disk.free()
        answer = generate("url")
        assert answer.status_code == 200, answer.text
        assert httpx.get(answer.json()["data"][0]["url"]).status_code == 200
