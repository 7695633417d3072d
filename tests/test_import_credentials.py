"""Imports never borrow the operator's credentials (issue 70, S2): a live server whose blob store is a
bucket on moto's S3 server, with the operator's AWS keys in its environment (as the chart's `s3.enabled`
had them) and its default endpoint moto's (AWS_ENDPOINT_URL).

On main, tenant B imported `s3://<the blob store's bucket>/…` (account A's model files and uploads) with
the operator's keys, and any private bucket those keys could read. Now: the blob store's bucket and
endpoint are refused before anything starts; any other bucket is read unsigned (moto, as S3, refuses
an unsigned read of a private object: `source_denied`), unless the operator lent its credentials to it
(MODELHOST_IMPORT_OPERATOR_CREDENTIALS_BUCKETS). The blob store's own keys can come from secret files
(MODELHOST_S3_ACCESS_KEY_ID / MODELHOST_S3_SECRET_ACCESS_KEY) instead of the environment.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from pydantic import ValidationError

from modelhost.artifacts.s3 import blob_store_of
from modelhost.config import Settings
from tests.conftest import S3_REGION, make_settings
from tests.helpers import ADMIN_KEY, bearer, push_folder_sync
from tests.live import live_server
from tests.test_imports import TENANT_KEYS, import_and_wait

TINY = ("t03_feature_extraction", "st")
LENT = "shared-models"  # the operator lends its credentials to this bucket, and to no other
PRIVATE = "private-models"  # private objects, lent to nobody
PUBLIC = "public-models"  # objects anyone may read (ACL public-read)


@pytest.fixture(scope="module")
def blob_bucket(s3_endpoint: str, recipes: Path) -> str:
    """The blob store's bucket, and three buckets of the tiny model under `tiny/`."""
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name=S3_REGION)
    name = f"platform-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    folder = recipes.joinpath(*TINY)
    for bucket in (LENT, PRIVATE, PUBLIC):
        s3.create_bucket(Bucket=bucket)
        for full in (p for p in folder.rglob("*") if p.is_file()):
            key = f"tiny/{full.relative_to(folder).as_posix()}"
            acl = {"ACL": "public-read"} if bucket == PUBLIC else {}
            s3.put_object(Bucket=bucket, Key=key, Body=full.read_bytes(), **acl)
    return name


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str, blob_bucket: str) -> Iterator[str]:
    """Blobs in `blob_bucket` on moto; the operator's keys in the environment (s3_endpoint's fixture sets
    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) and its endpoint moto's; loopback allowed as a network, so
    that a tenant's endpoint on moto is refused for being the blob store, not for its address."""
    root = tmp_path_factory.mktemp("import-credentials")
    settings = make_settings(
        root,
        f"sqlite:///{root / 'db.sqlite'}",
        blob_store="s3",
        s3_bucket=blob_bucket,
        s3_endpoint_url=s3_endpoint,
        import_operator_credentials_buckets=f" {LENT} ,",
        media_allow_networks=["127.0.0.0/8"],
        import_poll_seconds=0.2,
        worker_threads=1,
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ENDPOINT_URL", s3_endpoint)
        with live_server(settings) as url:
            yield url


def new_account(server: str, name: str) -> str:
    made = httpx.post(f"{server}/v1/admin/accounts", json={"name": name}, headers=bearer(ADMIN_KEY))
    assert made.status_code == 201, made.text
    key: str = made.json()["api_key"]
    return key


@pytest.fixture(scope="module")
def victim(server: str, recipes: Path) -> str:
    """Account A's model, pushed into the blob store; its artifact's ID."""
    key = new_account(server, "a")
    with httpx.Client(base_url=server, timeout=60) as http:
        return push_folder_sync(http, key, recipes.joinpath(*TINY), "feature-extraction")


@pytest.fixture
def key(server: str) -> str:
    return new_account(server, "b")


def start(server: str, key: str, body: dict[str, Any]) -> tuple[httpx.Response, str]:
    """POST an import into a new artifact of `key`'s account: the answer, and the artifact's ID."""
    made = httpx.post(
        f"{server}/v1/model-artifacts",
        json={"display_name": "t", "pipeline": "feature-extraction"},
        headers=bearer(key),
    )
    artifact: str = made.json()["id"]
    answer = httpx.post(f"{server}/v1/model-artifacts/{artifact}/imports", json=body, headers=bearer(key))
    return answer, artifact


def test_a_tenant_cannot_import_the_blob_stores_bucket_whatever_credentials_it_gives(
    server: str, key: str, blob_bucket: str, victim: str
) -> None:
    """Found by the review (S2): B listed `s3://<platform bucket>/` and imported A's weights."""
    for source in (f"s3://{blob_bucket}", f"s3://{blob_bucket}/artifacts/{victim}"):
        for credentials in (None, TENANT_KEYS):
            answer, artifact = start(server, key, {"source": source, "credentials": credentials})
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert (error["param"], error["code"]) == ("source", "source_refused"), error
            shown = httpx.get(f"{server}/v1/model-artifacts/{artifact}", headers=bearer(key)).json()
            assert (shown["status"], shown["import_id"]) == ("created", None)  # B got nothing of A's


@pytest.mark.parametrize("spelling", ["{endpoint}", "{endpoint}/", "HTTP://127.0.0.1:{port}/x", "{local}"])
def test_the_blob_stores_endpoint_is_refused_as_a_tenants_endpoint(
    server: str, key: str, s3_endpoint: str, spelling: str
) -> None:
    port = s3_endpoint.rsplit(":", 1)[1]
    endpoint = spelling.format(endpoint=s3_endpoint, port=port, local=f"http://[::ffff:127.0.0.1]:{port}")
    credentials = {**TENANT_KEYS, "endpoint_url": endpoint}
    answer, _ = start(server, key, {"source": f"s3://{PRIVATE}/tiny", "credentials": credentials})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == ("credentials.endpoint_url", "source_refused"), error


def test_a_private_bucket_without_credentials_is_read_unsigned_and_refused(server: str, key: str) -> None:
    """On main the operator's keys signed the requests and the import completed."""
    done = import_and_wait(server, key, {"source": f"s3://{PRIVATE}/tiny"})
    assert (done["status"], (done["error"] or {}).get("code")) == ("failed", "source_denied"), done


def test_a_public_bucket_imports_without_credentials(server: str, key: str) -> None:
    done = import_and_wait(server, key, {"source": f"s3://{PUBLIC}/tiny"})
    assert done["status"] == "completed", done


def test_a_bucket_the_operator_lent_its_credentials_to_imports_with_them(server: str, key: str) -> None:
    done = import_and_wait(server, key, {"source": f"s3://{LENT}/tiny"})
    assert done["status"] == "completed", done
    assert "config.json" in {f["path"] for f in done["files"]}


def test_the_blob_stores_bucket_cannot_be_lent_to_imports(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="never an import's source"):
        make_settings(
            tmp_path,
            "sqlite://",
            blob_store="s3",
            s3_bucket="Platform",
            import_operator_credentials_buckets="models,platform",
        )


def test_the_blob_stores_keys_come_from_secret_files_with_none_in_the_environment(
    tmp_path: Path, s3_endpoint: str, blob_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # not one whose credentials were read before
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "MODELHOST_S3_ACCESS_KEY_ID").write_text("from-a-file")
    (secrets / "MODELHOST_S3_SECRET_ACCESS_KEY").write_text("secret-from-a-file")
    common: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "blob_store": "s3",
        "s3_bucket": blob_bucket,
        "s3_endpoint_url": s3_endpoint,
        "s3_region": S3_REGION,
    }
    settings = Settings(_secrets_dir=secrets, **common)  # type: ignore[call-arg]
    assert settings.s3_access_key_id is not None
    store = blob_store_of(settings)
    signed: list[bytes] = []

    def record(request: Any, **_: Any) -> None:
        signed.append(request.headers["Authorization"])

    store._client.meta.events.register("before-send.s3", record)  # type: ignore[attr-defined]
    writer = store.writer("files/from-secret-files")
    writer.write(b"kept")
    writer.commit()
    assert store.read_range("files/from-secret-files", 0, 4) == b"kept"
    assert signed and all(b"Credential=from-a-file/" in s for s in signed)
    from botocore.exceptions import NoCredentialsError

    with pytest.raises(NoCredentialsError):  # without the files, nothing else holds keys here
        blob_store_of(Settings(**common)).exists("files/from-secret-files")
