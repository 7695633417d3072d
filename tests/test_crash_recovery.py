"""A server killed (SIGKILL) during an upload or a completion restarts into a consistent state."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from modelhost.container import Services
from modelhost.store.models import ModelArtifact, UploadSession
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, bearer
from tests.server_process import ServerProcess

Json = dict[str, Any]


@pytest.fixture
def server(tmp_path: Path, sqlite_url: str) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path / "data", sqlite_url)
    process.start()
    yield process
    process.stop()


def setup_upload(url: str, pipeline: str = "feature-extraction") -> tuple[str, str, str]:
    admin = bearer(ADMIN_KEY)
    key = httpx.post(f"{url}/v1/admin/accounts", json={"name": "a"}, headers=admin).json()["api_key"]
    art = httpx.post(
        f"{url}/v1/model-artifacts", json={"display_name": "m", "pipeline": pipeline}, headers=bearer(key)
    ).json()
    upload_id = httpx.post(f"{url}/v1/model-artifacts/{art['id']}/uploads", headers=bearer(key)).json()[
        "upload_id"
    ]
    return key, art["id"], f"/v1/model-artifacts/{art['id']}/uploads/{upload_id}"


def put_folder(url: str, key: str, base: str, folder: Path) -> None:
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        path = file.relative_to(folder).as_posix()
        response = httpx.put(
            f"{url}{base}/files/{path}", content=file.read_bytes(), headers=bearer(key), timeout=60
        )
        assert response.status_code == 200, response.text


def test_sigkill_during_a_file_upload_leaves_the_session_resumable(
    server: ServerProcess, minilm_dir: Path
) -> None:
    key, artifact_id, base = setup_upload(server.url)
    sent = threading.Event()

    def slow_body() -> Iterator[bytes]:
        for _ in range(200):
            yield b"\0" * 65536
            sent.set()
            time.sleep(0.01)

    def upload() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server dies under us: expected
            httpx.put(
                f"{server.url}{base}/files/model.safetensors",
                content=slow_body(),
                headers=bearer(key),
                timeout=30,
            )

    worker = threading.Thread(target=upload)
    worker.start()
    assert sent.wait(10)
    time.sleep(0.2)
    server.kill()
    worker.join(30)
    server.start()
    session = httpx.get(f"{server.url}{base}", headers=bearer(key)).json()
    assert session["status"] == "open" and session["files"] == []  # the half file was never recorded
    artifact = httpx.get(f"{server.url}/v1/model-artifacts/{artifact_id}", headers=bearer(key)).json()
    assert artifact["status"] == "ingesting" and artifact["upload_id"] in base
    put_folder(server.url, key, base, minilm_dir)
    finished = httpx.post(f"{server.url}{base}/complete", headers=bearer(key), timeout=120).json()
    assert finished["artifact"]["status"] == "ready"


def test_sigkill_during_complete_never_leaves_the_artifact_stuck(
    server: ServerProcess, minilm_dir: Path
) -> None:
    key, artifact_id, base = setup_upload(server.url)
    put_folder(server.url, key, base, minilm_dir)

    def complete() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{server.url}{base}/complete", headers=bearer(key), timeout=60)

    worker = threading.Thread(target=complete)
    worker.start()
    time.sleep(0.5)  # inside inspection: the fresh process is importing transformers
    server.kill()
    worker.join(60)
    server.start()
    session = httpx.get(f"{server.url}{base}", headers=bearer(key)).json()
    artifact = httpx.get(f"{server.url}/v1/model-artifacts/{artifact_id}", headers=bearer(key)).json()
    assert session["status"] in {"open", "completed"}, session
    if session["status"] == "open":  # resumable: completing again finishes the job
        assert artifact["status"] == "ingesting"
        artifact = httpx.post(f"{server.url}{base}/complete", headers=bearer(key), timeout=120).json()[
            "artifact"
        ]
    assert artifact["status"] == "ready"


def recovery_services(tmp_path: Path, sqlite_url: str) -> tuple[Services, str, str]:
    """An artifact with a session forced into `completing`, as a crash mid-complete leaves it."""
    services = Services.build(make_settings(tmp_path, sqlite_url))
    account = services.accounts.create("a", 0)[0].account
    artifact = services.artifacts.create(account.id, "m", "fill-mask").artifact
    upload, _ = services.artifacts.start_upload(account.id, artifact.id)
    with services.database.transaction() as session:
        session.execute(
            update(UploadSession).where(UploadSession.id == upload.id).values(status="completing")
        )
    return services, artifact.id, upload.id


def _status(services: Services, artifact_id: str, upload_id: str) -> tuple[str, str, str | None]:
    with services.database.transaction() as session:
        artifact = session.get(ModelArtifact, artifact_id)
        upload = session.get(UploadSession, upload_id)
        assert artifact is not None and upload is not None
        return artifact.status, upload.status, artifact.error_code


def test_recovery_reopens_a_completion_whose_staging_is_intact(tmp_path: Path, sqlite_url: str) -> None:
    services, artifact_id, upload_id = recovery_services(tmp_path, sqlite_url)
    writer = services.blobs.writer(f"staging/{upload_id}/config.json")
    writer.write(b"{}")
    writer.commit()
    assert services.artifacts.recover() == 1
    assert _status(services, artifact_id, upload_id) == ("ingesting", "open", None)


def test_recovery_finishes_a_completion_that_had_published(tmp_path: Path, sqlite_url: str) -> None:
    services, artifact_id, upload_id = recovery_services(tmp_path, sqlite_url)
    writer = services.blobs.writer(f"artifacts/{artifact_id}/{upload_id}/config.json")
    writer.write(b"{}")
    writer.commit()
    services.artifacts.recover()
    assert _status(services, artifact_id, upload_id) == ("ready", "completed", None)


def test_recovery_fails_a_completion_with_nothing_left_as_interrupted(
    tmp_path: Path, sqlite_url: str
) -> None:
    services, artifact_id, upload_id = recovery_services(tmp_path, sqlite_url)
    services.artifacts.recover()
    assert _status(services, artifact_id, upload_id) == ("failed", "failed", "interrupted")
