"""What a server needs when it starts inside a container (issue 61): its secrets from files, and a
database and S3 store that may come up after it (compose and Kubernetes start them side by side). Several
servers starting together on one PostgreSQL migrate it in turn."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
from sqlalchemy import inspect

from modelhost.artifacts.s3 import S3BlobStore
from modelhost.config import Settings
from modelhost.store import migrate
from modelhost.store.db import Database
from tests.conftest import S3_REGION
from tests.postgres import create_database
from tests.server_process import free_port

ADMIN_FROM_FILE = "mh-admin-" + "f" * 40


def test_a_setting_is_read_from_a_file_named_like_its_variable_in_the_secrets_dir(tmp_path: Path) -> None:
    (tmp_path / "MODELHOST_ADMIN_KEY").write_text(ADMIN_FROM_FILE + "\n")  # as editors and kubectl write it
    (tmp_path / "MODELHOST_DATABASE_URL").write_text("postgresql+psycopg://u:p@db:5432/modelhost")
    settings = Settings(_secrets_dir=tmp_path, _env_file=None)  # type: ignore[call-arg]
    assert settings.admin_key_value == ADMIN_FROM_FILE
    assert settings.database_url == "postgresql+psycopg://u:p@db:5432/modelhost"


def test_an_environment_variable_wins_over_a_secret_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "MODELHOST_ADMIN_KEY").write_text(ADMIN_FROM_FILE)
    monkeypatch.setenv("MODELHOST_ADMIN_KEY", "mh-admin-" + "e" * 40)
    settings = Settings(_secrets_dir=tmp_path, _env_file=None)  # type: ignore[call-arg]
    assert settings.admin_key_value == "mh-admin-" + "e" * 40


def test_a_server_waits_for_an_unreachable_database_then_starts_anyway() -> None:
    """Nothing listens on the port: the wait ends after its time instead of failing the start (the
    first transaction then answers 503, as with a database lost later)."""
    database = Database(f"postgresql+psycopg://modelhost:x@127.0.0.1:{free_port()}/modelhost")
    database.wait_until_reachable(1.5)
    assert not database.ping()
    database.dispose()


def test_servers_starting_together_migrate_one_postgresql_in_turn(postgres_base_url: str) -> None:
    """Two gateways' first start on an empty database: the advisory lock lets one create the schema
    while the other waits, then finds it current (without it, both ran the same CREATE TABLEs)."""
    url = create_database(postgres_base_url, f"t_{uuid.uuid4().hex[:12]}")
    databases = [Database(url), Database(url)]
    failures: list[BaseException] = []

    def start(database: Database) -> None:
        try:
            migrate.upgrade(database)
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=start, args=(database,)) for database in databases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == []
    assert migrate.is_current(databases[0])
    assert "deployments" in inspect(databases[0].engine).get_table_names()
    for database in databases:
        database.dispose()


@pytest.fixture
def s3(s3_endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name=S3_REGION)


def test_a_missing_bucket_is_made_at_start_when_asked(s3: Any, tmp_path: Path) -> None:
    name = f"made-{uuid.uuid4().hex[:12]}"
    S3BlobStore(s3, name, tmp_path / "cache").wait_for_bucket(5, create=True)
    s3.head_bucket(Bucket=name)
    S3BlobStore(s3, name, tmp_path / "cache").wait_for_bucket(5, create=True)  # a restart: it exists


def test_a_missing_bucket_is_left_to_the_operator_unless_asked(s3: Any, tmp_path: Path) -> None:
    name = f"absent-{uuid.uuid4().hex[:12]}"
    S3BlobStore(s3, name, tmp_path / "cache").wait_for_bucket(5, create=False)
    assert name not in [bucket["Name"] for bucket in s3.list_buckets()["Buckets"]]


def test_a_server_waits_for_an_unreachable_s3_store_then_starts_anyway(tmp_path: Path) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        region_name=S3_REGION,
        config=boto3.session.Config(retries={"max_attempts": 1}, connect_timeout=1),
    )
    S3BlobStore(client, "later", tmp_path / "cache").wait_for_bucket(1.5, create=True)
