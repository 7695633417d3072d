"""Imports from HTTPS and a Hub, end to end (issue 52): a live server imports from the local HTTPS and
Hub-compatible servers (tests/remote_servers.py, a test CA trusted through SSL_CERT_FILE, loopback
allowed as an operator allows a network) and the artifact becomes ready, or fails saying why.

For the integrator: these need the imports' API, runner and CLI (`modelhost.imports.runner`), so they
are skipped where it is missing (the `fetchers` branch alone); the archive ones need the runner to
unpack a `RemoteFile(archive=True)` with `imports.archive.unpack`.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, bearer
from tests.live import live_server
from tests.remote_servers import RemoteServer, TestCA
from tests.test_imports import import_and_wait

pytest.importorskip("modelhost.imports.runner", reason="needs the imports' API (merged from `imports`)")

TINY = ("t03_feature_extraction", "st")  # a sentence-transformers model: folders, modules.json
# The server's own Hub token (HF_TOKEN): it reads `org/operators` and `org/lent`, which are gated to it;
# the operator lends it to `org/lent` only (MODELHOST_IMPORT_HUB_OPERATOR_TOKEN_REPOS).
OPERATOR_TOKEN = "hf_" + hashlib.sha256(b"the operator's own").hexdigest()


@pytest.fixture(scope="module")
def model_files(recipes: Path) -> dict[str, bytes]:
    folder = recipes.joinpath(*TINY)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory, model_files: dict[str, bytes]) -> Iterator[RemoteServer]:
    """One HTTPS server for the files, archives and Hub routes, one more as the Hub's CDN; trusted and
    named by the server's environment (SSL_CERT_FILE, HF_ENDPOINT), which holds the operator's token."""
    ca = TestCA(tmp_path_factory.mktemp("ca"))
    files, cdn = RemoteServer(ca), RemoteServer(ca)
    files.add_hub_repo("org/tiny", model_files | {"pytorch_model.bin": b"not fetched"}, cdn)
    for repo in ("org/operators", "org/lent"):
        files.add_hub_repo(repo, model_files, cdn, token=OPERATOR_TOKEN)
    files.files["tiny.tar.gz"] = tarball({f"tiny/{path}": data for path, data in model_files.items()})
    files.files["evil.tar.gz"] = tarball({"tiny/config.json": b"{}", "../../escape": b"x"})
    files.files |= {f"tiny/{path}": data for path, data in model_files.items()}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SSL_CERT_FILE", str(ca.ca_file))
        env.setenv("HF_ENDPOINT", files.base)
        env.setenv("HF_TOKEN", OPERATOR_TOKEN)
        yield files
    files.close()
    cdn.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, remote: RemoteServer) -> Iterator[str]:
    root = tmp_path_factory.mktemp("imports-remote")
    settings = make_settings(
        root,
        f"sqlite:///{root / 'db.sqlite'}",
        import_poll_seconds=0.2,
        worker_threads=1,
        media_allow_networks=["127.0.0.0/8"],
        import_hub_operator_token_repos="org/lent",
    )
    with live_server(settings) as url:
        yield url


@pytest.fixture
def key(server: str) -> str:
    made = httpx.post(f"{server}/v1/admin/accounts", json={"name": "importer"}, headers=bearer(ADMIN_KEY))
    value: str = made.json()["api_key"]
    return value


def tarball(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_hub_model_becomes_ready_with_one_command(server: str, key: str) -> None:
    arguments = ["artifacts", "import", "hf://org/tiny", "--pipeline", "feature-extraction"]
    result = CliRunner().invoke(
        cli_app(), [*arguments, "--url", server, "--key", key], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert "ready" in result.output


def test_a_hub_import_fetches_only_what_inspection_needs(server: str, key: str) -> None:
    done = import_and_wait(server, key, {"source": "hf://org/tiny@main"})
    assert done["status"] == "completed", done
    paths = {f["path"] for f in done["files"]}
    assert {"model.safetensors", "modules.json", "1_Pooling/config.json"} <= paths
    assert not paths & {"pytorch_model.bin", "README.md"}


def test_an_https_archive_becomes_ready(server: str, key: str, remote: RemoteServer) -> None:
    done = import_and_wait(server, key, {"source": remote.url("tiny.tar.gz")})
    assert done["status"] == "completed", done
    shown = httpx.get(f"{server}/v1/model-artifacts/{done['artifact_id']}", headers=bearer(key)).json()
    assert shown["status"] == "ready"


def test_a_list_of_https_files_becomes_ready(
    server: str, key: str, remote: RemoteServer, model_files: dict[str, bytes]
) -> None:
    source = [{"url": remote.url(f"tiny/{path}"), "path": path} for path in model_files]
    done = import_and_wait(server, key, {"source": source})
    assert done["status"] == "completed", done


@pytest.mark.parametrize(
    ("source", "code"),
    [
        ("evil.tar.gz", "unsafe_archive"),
        ("missing.tar.gz", "source_not_found"),
        ("redirect-private", "address_refused"),
        ("wrong-sha256", "checksum_mismatch"),
    ],
)
def test_an_https_import_that_cannot_be_trusted_fails_with_why(
    server: str, key: str, remote: RemoteServer, source: str, code: str
) -> None:
    given: Any = remote.url(source)
    if source == "redirect-private":
        given = f"{remote.base}/redirect?to=https://10.0.0.1/model.tar.gz"
    elif source == "wrong-sha256":
        given = [{"url": remote.url("tiny/config.json"), "path": "config.json", "sha256": "0" * 64}]
    done = import_and_wait(server, key, {"source": given})
    assert (done["status"], done["error"]["code"]) == ("failed", code), done


def test_the_hub_token_given_is_never_shown(server: str, key: str) -> None:
    secret = "hf_" + hashlib.sha256(b"never shown").hexdigest()
    done = import_and_wait(server, key, {"source": "hf://org/tiny", "credentials": {"token": secret}})
    assert done["status"] == "completed", done
    assert secret not in json.dumps(done)


def cli_app() -> Any:
    from modelhost.cli.main import app

    return app


def test_the_servers_hub_token_is_never_sent_for_a_repository_it_was_not_lent_to(
    server: str, key: str, remote: RemoteServer
) -> None:
    """Found by the review (issue 70, as S2 for S3): an import without a token read with the server's
    (HF_TOKEN), so any account imported what only the operator may read."""
    seen = len(remote.requests)
    public = import_and_wait(server, key, {"source": "hf://org/tiny"})
    assert public["status"] == "completed", public
    private = import_and_wait(server, key, {"source": "hf://org/operators"})
    assert (private["status"], (private["error"] or {}).get("code")) == ("failed", "source_denied"), private
    sent = [headers.get("Authorization") for _, headers in remote.requests[seen:]]
    assert sent and not any(sent), sent


def test_a_repository_the_operator_lent_its_token_to_imports_with_it(
    server: str, key: str, remote: RemoteServer
) -> None:
    seen = len(remote.requests)
    done = import_and_wait(server, key, {"source": "hf://org/lent"})
    assert done["status"] == "completed", done
    sent = [headers.get("Authorization") for _, headers in remote.requests[seen:]]
    assert f"Bearer {OPERATOR_TOKEN}" in sent
