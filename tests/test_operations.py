"""Operations surface: /health, /ready, /metrics, /docs and the OpenAPI document."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from unittest import mock

import httpx
import pytest
from sqlalchemy import text

from modelhost.api.app import create_app
from modelhost.billing.meter import CREDITS_BILLED
from modelhost.config import Settings
from modelhost.container import Services
from modelhost.metrics import Histogram, Tally
from modelhost.store import migrate
from modelhost.store.db import Database
from tests import SUITE_VALUES, TEST_SUITE_SETTINGS
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer


async def test_health_answers_without_auth(client: httpx.AsyncClient) -> None:
    assert (await client.get("/health")).json() == {"status": "ok"}


async def test_ready_when_database_is_migrated(client: httpx.AsyncClient) -> None:
    body = (await client.get("/ready")).json()
    assert body["status"] == "ready" and body["disk"] in ("ok", "low"), body


async def test_not_ready_when_migrations_are_behind(tmp_path: Path, database_url: str) -> None:
    settings = make_settings(tmp_path, database_url, apply_migrations_on_start=False)
    services = Services.build(settings)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(services=services)), base_url="http://t"
        ) as http:
            response = await http.get("/ready")
        assert_error(response, 503, "service_unavailable")
        assert "migrations" in response.json()["error"]["message"]
    finally:
        services.close()


def test_migrations_go_up_from_empty(database_url: str) -> None:
    database = Database(database_url)
    assert migrate.current_revision(database) is None
    migrate.upgrade(database)
    assert migrate.is_current(database)
    with database.engine.connect() as conn:
        for table in (
            "accounts",
            "api_keys",
            "deployments",
            "model_artifacts",
            "upload_sessions",
            "upload_files",
        ):
            conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
    migrate.upgrade(database)  # idempotent
    database.dispose()


def test_postgres_url_needs_no_code_change(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url="postgresql+psycopg://u@localhost:1/db")
    assert Database(settings.database_url).is_sqlite is False
    default = Settings(data_dir=tmp_path / "d")
    assert default.database_url == f"sqlite:///{(tmp_path / 'd' / 'modelhost.db').as_posix()}"


async def test_metrics_count_requests_by_route_and_status(client: httpx.AsyncClient) -> None:
    await client.get("/v1/keys")  # 401
    await client.get("/health")
    body = (await client.get("/metrics")).text
    assert 'modelhost_http_requests_total{method="GET",route="/v1/keys",status="401"}' in body
    assert 'modelhost_http_request_duration_seconds_bucket{le="0.005",method="GET",route="/health"}' in body


def test_observations_written_together_land_where_one_by_one_they_would() -> None:
    """The request metrics are written in batches (`metrics.Tally`): the buckets and the sum of a
    histogram end as observing each value would leave them, bounds included."""
    buckets = (0.001, 0.01, 0.1, 1.0)
    first, second = (
        Histogram(f"mh_test_observe_{n}", "t", ["route"], buckets=buckets, registry=None) for n in "ab"
    )
    one_by_one, together = first.labels("/v1/x"), second.labels("/v1/x")
    values = [0.0, 0.001, 0.0010001, 0.005, 0.01, 0.5, 1.0, 2.0, 30.0, 0.0999]
    for value in values:
        one_by_one.observe(value)
    tally = Tally()
    with mock.patch.object(tally, "_due"):  # no flush but the one below
        for value in values:
            tally.observe(second, ("/v1/x",), value)
    assert together._sum.get() == 0  # not written yet: one flush writes them all
    tally.flush()
    for written in (one_by_one, together):
        assert written._sum.get() == pytest.approx(sum(values))
    assert [b.get() for b in together._buckets] == [b.get() for b in one_by_one._buckets] == [2, 3, 1, 2, 2]


async def test_head_metrics_answers_200_without_a_body(client: httpx.AsyncClient) -> None:
    answer = await client.head("/metrics")
    assert answer.status_code == 200 and answer.content == b""
    assert answer.headers["content-type"].startswith("text/plain")


async def test_metrics_name_accounts_only_to_the_admin_or_metrics_key(
    tmp_path: Path, sqlite_url: str
) -> None:
    """Series labelled with an account (the credits billed to it) are left out of /metrics without the
    admin key or MODELHOST_METRICS_KEY; `metrics_public` shows them to anyone."""
    CREDITS_BILLED.labels("acct_metricsprobe", "storage").inc(1)  # what billing counts for an account
    scraper = "mh-metrics-" + secrets.token_urlsafe(24)
    for public in (False, True):
        settings = make_settings(tmp_path / str(public), sqlite_url, metrics_key=scraper)
        services = Services.build(settings.model_copy(update={"metrics_public": public}))
        try:
            transport = httpx.ASGITransport(app=create_app(services=services))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                anyone = (await http.get("/metrics")).text
                assert "modelhost_" in anyone
                assert ('account="acct_metricsprobe"' in anyone) is public
                for key in (ADMIN_KEY, scraper):
                    scraped = (await http.get("/metrics", headers=bearer(key))).text
                    series = 'modelhost_credits_billed_total{account="acct_metricsprobe",kind="storage"}'
                    assert series in scraped
                other = await http.get("/metrics", headers=bearer("mh-" + secrets.token_urlsafe(32)))
                assert other.status_code == 200  # an account's key (the console's) sees what anyone does
                assert ('account="acct_metricsprobe"' in other.text) is public
        finally:
            services.close()


async def test_docs_page_and_openapi_describe_routes_auth_and_errors(client: httpx.AsyncClient) -> None:
    assert "swagger" in (await client.get("/docs")).text.lower()
    schema = (await client.get("/openapi.json")).json()
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    keys_post = schema["paths"]["/v1/keys"]["post"]
    assert keys_post["security"] == [{"HTTPBearer": []}]
    assert "422" not in keys_post["responses"]
    for status in ("400", "401", "413"):
        assert keys_post["responses"][status]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorBody"
        }
    assert "ErrorBody" in schema["components"]["schemas"]
    for path in ("/v1/admin/accounts", "/v1/deployments/{deployment_id}", "/v1/models", "/health", "/ready"):
        assert path in schema["paths"]


# Every OpenAI-family answer shaped by `serving/` is a declared model (issue 59): the one each
# operation's 200 documents, by its OpenAI name
TYPED_ANSWERS = {
    ("post", "/v1/images/generations"): {"ImagesResponse"},
    ("post", "/v1/images/edits"): {"ImagesResponse"},
    ("post", "/v1/embeddings"): {"CreateEmbeddingResponse"},
    ("post", "/v1/audio/transcriptions"): {"Transcription", "VerboseTranscription"},
    ("post", "/v1/audio/translations"): {"Transcription", "VerboseTranslation"},
    ("post", "/v1/rerank"): {"RerankResponse"},
    ("post", "/v2/rerank"): {"RerankResponse"},
    ("post", "/rerank"): {"RerankResponse"},
    ("post", "/v1/videos"): {"Video"},
    ("post", "/v1/videos/{video_id}/remix"): {"Video"},
    ("get", "/v1/videos"): {"VideoList"},
    ("get", "/v1/videos/{video_id}"): {"Video"},
    ("delete", "/v1/videos/{video_id}"): {"VideoDeleted"},
}


async def test_openapi_declares_the_typed_answer_of_every_openai_family_operation(
    client: httpx.AsyncClient,
) -> None:
    schema = (await client.get("/openapi.json")).json()
    components = schema["components"]["schemas"]
    for (method, path), names in TYPED_ANSWERS.items():
        answer = schema["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        refs = [answer] if "$ref" in answer else answer.get("anyOf", [])
        declared = {ref["$ref"].removeprefix("#/components/schemas/") for ref in refs}
        assert declared == names, (method, path, answer)
        for name in declared:
            assert components[name]["properties"], name


async def test_admin_routes_are_off_without_an_admin_key(tmp_path: Path, sqlite_url: str) -> None:
    services = Services.build(Settings(data_dir=tmp_path, database_url=sqlite_url))
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(services=services)), base_url="http://t"
        ) as http:
            response = await http.get("/v1/admin/accounts", headers=bearer(ADMIN_KEY))
        assert "MODELHOST_ADMIN_KEY" in assert_error(response, 401, type_="InvalidAPIKeyError")["message"]
    finally:
        services.close()


def _admin_key_seen_in(folder: Path, env: dict[str, str]) -> str:
    """What a fresh process started in `folder` (as the tests start servers) takes as the admin key."""
    code = "from modelhost.config import Settings; print(Settings().admin_key_value)"
    done = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_tests_and_their_servers_read_no_env_file_and_none_of_the_callers_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make run` writes the operator's admin key into the checkout's `.env`; `make test` after it must
    not see it (nor a `MODELHOST_*` the caller exported)."""
    (tmp_path / ".env").write_text("MODELHOST_ADMIN_KEY=mh-admin-from-make-run\n")
    assert not [name for name in os.environ if name.startswith("MODELHOST_") and name not in SUITE_VALUES
                and not name.startswith(TEST_SUITE_SETTINGS)]  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert Settings().admin_key is None
    assert _admin_key_seen_in(tmp_path, dict(os.environ)) == "None"
    # what the tests are kept from: a process with the ordinary environment reads the file
    ordinary = {name: value for name, value in os.environ.items() if name != "MODELHOST_ENV_FILE"}
    assert _admin_key_seen_in(tmp_path, ordinary) == "mh-admin-from-make-run"
