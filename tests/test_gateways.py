"""Two gateway processes (`modelhost serve`) on one PostgreSQL and one data directory serve the same
accounts: what one writes, the other sees; what one revokes, the other refuses within its cache
lifetime; a video job runs exactly once whichever gateway picks it up; a key's rate limits hold across
both once they have shared their counts (one sync interval)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from modelhost.store.db import Database
from modelhost.store.models import VideoJob
from tests.helpers import ADMIN_KEY, bearer
from tests.postgres import create_database
from tests.server_process import ServerProcess

KEY_CACHE_SECONDS = 1.0
LIMITS_SYNC_SECONDS = 0.2


@dataclass
class Pair:
    a: httpx.Client
    b: httpx.Client
    database_url: str
    key: str


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, postgres_base_url: str) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("gateways")
    database_url = create_database(postgres_base_url, f"g_{secrets.token_hex(6)}")
    env = {
        "MODELHOST_KEY_CACHE_SECONDS": str(KEY_CACHE_SECONDS),
        "MODELHOST_WORKER_THREADS": "1",
        "MODELHOST_VIDEO_POLL_SECONDS": "0.05",
        "MODELHOST_LIMITS_SYNC_SECONDS": str(LIMITS_SYNC_SECONDS),
    }
    servers = [ServerProcess(root / "data", database_url, **env) for _ in range(2)]
    try:
        for server in servers:
            server.start()
        a, b = (httpx.Client(base_url=s.url, timeout=120) for s in servers)
        made = a.post("/v1/admin/accounts", json={"name": "shared"}, headers=bearer(ADMIN_KEY))
        yield Pair(a, b, database_url, made.json()["api_key"])
        a.close()
        b.close()
    finally:
        for server in servers:
            server.stop()


def test_a_key_revoked_on_one_gateway_is_refused_on_the_other_within_the_cache_lifetime(pair: Pair) -> None:
    made = pair.a.post("/v1/keys", json={"name": "short-lived"}, headers=bearer(pair.key)).json()
    secret = made["api_key"]
    assert pair.b.get("/v1/keys", headers=bearer(secret)).status_code == 200  # B caches it now
    assert pair.a.delete(f"/v1/keys/{made['id']}", headers=bearer(pair.key)).status_code == 200
    revoked = time.monotonic()
    assert pair.a.get("/v1/keys", headers=bearer(secret)).status_code == 401  # at once where revoked
    while pair.b.get("/v1/keys", headers=bearer(secret)).status_code == 200:
        # the cache's lifetime, plus room for a loaded machine's slow requests (a key B never stopped
        # accepting fails here all the same)
        assert time.monotonic() - revoked < KEY_CACHE_SECONDS + 10.0, "B still accepts the revoked key"
        time.sleep(0.05)
    assert pair.b.get("/v1/keys", headers=bearer(pair.key)).status_code == 200  # other keys unaffected


def test_an_upload_started_on_one_gateway_completes_on_the_other_and_both_serve_it(
    pair: Pair, recipes: Path
) -> None:
    folder, headers = recipes / "t03_feature_extraction" / "st", bearer(pair.key)
    body = {"display_name": "split", "pipeline": "feature-extraction"}
    artifact = pair.a.post("/v1/model-artifacts", json=body, headers=headers).json()
    upload = pair.a.post(f"/v1/model-artifacts/{artifact['id']}/uploads", headers=headers).json()
    base = f"/v1/model-artifacts/{artifact['id']}/uploads/{upload['upload_id']}"
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    for index, file in enumerate(files):  # every other file through the other gateway
        gateway = pair.a if index % 2 else pair.b
        put = gateway.put(
            f"{base}/files/{file.relative_to(folder).as_posix()}", content=file.read_bytes(), headers=headers
        )
        assert put.status_code == 200, put.text
    assert len(pair.a.get(base, headers=headers).json()["files"]) == len(files)
    done = pair.b.post(f"{base}/complete", headers=headers)
    assert done.json()["artifact"]["status"] == "ready", done.text
    assert pair.a.get(f"/v1/model-artifacts/{artifact['id']}", headers=headers).json()["status"] == "ready"
    deployment = {"model": "split", "artifact_id": artifact["id"]}
    assert pair.a.post("/v1/deployments", json=deployment, headers=headers).status_code == 201
    embeddings = [
        gateway.post(
            "/v1/embeddings", json={"model": "split", "input": "same answer"}, headers=headers
        ).json()
        for gateway in (pair.a, pair.b)
    ]
    assert embeddings[0]["data"] == embeddings[1]["data"]
    usage = [gateway.get("/v1/usage", headers=headers).json() for gateway in (pair.a, pair.b)]
    assert usage[0]["credits_balance"] == usage[1]["credits_balance"]


def test_video_jobs_created_on_both_gateways_each_run_exactly_once(pair: Pair, recipes: Path) -> None:
    from tests.helpers import push_folder_sync

    headers = bearer(pair.key)
    folder = recipes / "t14_diffusers_text_to_video" / "text_to_video_sd"
    artifact_id = push_folder_sync(pair.a, pair.key, folder, "text-to-video")
    deployment = {"model": "t2v", "artifact_id": artifact_id}
    assert pair.b.post("/v1/deployments", json=deployment, headers=headers).status_code == 201
    job = {"model": "t2v", "prompt": "a cat", "seconds": 0.25, "size": "32x32", "num_inference_steps": 1}
    ids = [
        gateway.post("/v1/videos", json=job, headers=headers).json()["id"] for gateway in (pair.a, pair.b) * 3
    ]
    deadline = time.monotonic() + 180
    while any(pair.a.get(f"/v1/videos/{i}", headers=headers).json()["status"] != "completed" for i in ids):
        assert time.monotonic() < deadline, [
            pair.a.get(f"/v1/videos/{i}", headers=headers).json() for i in ids
        ]
        time.sleep(0.2)
    database = Database(pair.database_url)
    with database.transaction() as session:
        jobs = session.scalars(select(VideoJob).where(VideoJob.id.in_(ids))).all()
    database.dispose()
    assert sorted(j.id for j in jobs) == sorted(ids) and all(j.attempts == 1 for j in jobs)
    contents = [pair.b.get(f"/v1/videos/{i}/content", headers=headers) for i in ids]
    assert all(c.status_code == 200 and c.headers["content-type"] == "video/mp4" for c in contents)


def test_a_keys_rate_limits_hold_across_both_servers_once_they_have_shared_their_counts(
    pair: Pair, recipes: Path
) -> None:
    from tests.helpers import push_folder_sync

    headers = bearer(pair.key)
    artifact_id = push_folder_sync(
        pair.a, pair.key, recipes / "t03_feature_extraction" / "st", "feature-extraction"
    )
    deployment = {"model": "limited", "artifact_id": artifact_id}
    assert pair.a.post("/v1/deployments", json=deployment, headers=headers).status_code == 201
    body = {"model": "limited", "input": "hello"}
    for gateway in (pair.a, pair.b):  # loaded on both (the account itself is not limited)
        assert gateway.post("/v1/embeddings", json=body, headers=headers).status_code == 200
    made = pair.a.post(
        "/v1/keys", json={"name": "rpm", "limits": {"requests_per_minute": 4}}, headers=headers
    )
    key = made.json()["api_key"]
    answers = []
    for index in range(6):  # each server in turn, one sync interval and more apart
        gateway = (pair.a, pair.b)[index % 2]
        answers.append(gateway.post("/v1/embeddings", json=body, headers=bearer(key)))
        time.sleep(3 * LIMITS_SYNC_SECONDS)
    assert [a.status_code for a in answers] == [200, 200, 200, 200, 429, 429]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers[:4]] == ["3", "2", "1", "0"]
    assert answers[5].json()["error"]["code"] == "rate_limit_exceeded"
    for gateway in (pair.a, pair.b):
        [listed] = [
            k for k in gateway.get("/v1/keys", headers=headers).json()["data"] if k["id"] == made.json()["id"]
        ]
        assert listed["use"]["requests_remaining"] == 0
