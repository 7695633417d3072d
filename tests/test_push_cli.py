"""`modelhost artifacts push`: the whole protocol from a folder, resume, failure reasons, --deploy."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from modelhost.cli.main import app
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, bearer
from tests.live import live_server
from tests.recipes import GGUF_FOLDER

runner = CliRunner()
# the test's own calls: a loaded machine can take longer than httpx's default of 5 s (a ReadTimeout once)
http = httpx.Client(timeout=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("push")
    with live_server(make_settings(root, f"sqlite:///{root / 'db.sqlite'}")) as url:
        yield url


@pytest.fixture
def key(server: str) -> str:
    created = http.post(f"{server}/v1/admin/accounts", json={"name": "pusher"}, headers=bearer(ADMIN_KEY))
    value: str = created.json()["api_key"]
    return value


def push(server: str, key: str, folder: Path, *extra: str) -> tuple[int, str]:
    result = runner.invoke(
        app,
        ["artifacts", "push", str(folder), "--url", server, "--key", key, *extra],
        catch_exceptions=False,
    )
    return result.exit_code, result.output


def test_push_uploads_inspects_and_deploys(server: str, key: str, recipes: Path) -> None:
    options = ["--name", "ner", "--pipeline", "token-classification", "--deploy", "ner-model", "--json"]
    code, output = push(server, key, recipes / "t01_token_classification", *options)
    assert code == 0, output
    assert '"status": "ready"' in output
    deployments = http.get(f"{server}/v1/deployments", headers=bearer(key)).json()["data"]
    assert [d["model"] for d in deployments] == ["ner-model"]


def test_push_shows_progress_in_bytes_and_files(server: str, key: str, recipes: Path) -> None:
    folder = recipes / "t02_fill_mask"
    code, output = push(server, key, folder, "--name", "fm", "--pipeline", "fill-mask")
    assert code == 0, output
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert f"{len(files)}/{len(files)}" in output
    assert "ready" in output and "kB" in output


def test_push_resumes_and_skips_files_already_uploaded(server: str, key: str, recipes: Path) -> None:
    folder = recipes / "t02_fill_mask"
    art = http.post(
        f"{server}/v1/model-artifacts",
        json={"display_name": "resumed", "pipeline": "fill-mask"},
        headers=bearer(key),
    ).json()
    upload_id = http.post(f"{server}/v1/model-artifacts/{art['id']}/uploads", headers=bearer(key)).json()[
        "upload_id"
    ]
    first = folder / "config.json"  # an interrupted earlier push got this far
    http.put(
        f"{server}/v1/model-artifacts/{art['id']}/uploads/{upload_id}/files/config.json",
        content=first.read_bytes(),
        headers={**bearer(key), "X-Content-SHA256": hashlib.sha256(first.read_bytes()).hexdigest()},
    )
    code, output = push(server, key, folder, "--name", "resumed", "--pipeline", "fill-mask")
    assert code == 0, output
    assert f"resuming upload session {upload_id}" in output
    assert "skipped 1 file(s)" in output
    assert (
        http.get(f"{server}/v1/model-artifacts/{art['id']}", headers=bearer(key)).json()["status"] == "ready"
    )


def test_push_of_a_broken_model_prints_the_reason_and_fails(
    server: str, key: str, recipes: Path, tmp_path: Path
) -> None:
    folder = shutil.copytree(recipes / "t02_fill_mask", tmp_path / "broken")
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    code, output = push(server, key, folder, "--name", "bad", "--pipeline", "fill-mask", "--json")
    assert code == 1
    body = json.loads(output[output.index("{") :])
    assert body["artifact"]["status"] == "failed"
    assert body["artifact"]["error"]["code"] == "pickle_weights"
    assert "pickle" in body["message"].lower()


def test_push_of_a_gguf_file_shows_its_quantization_and_where_it_serves(
    server: str, key: str, recipes: Path
) -> None:
    folder = recipes / GGUF_FOLDER / "qwen3-Q4_0"
    code, output = push(server, key, folder, "--name", "q4", "--pipeline", "text-generation")
    assert code == 0, output
    assert "gguf Q4_0" in output
    assert "llamacpp on cpu: servable" in output
    assert "vllm on cpu: GGUF files are served by llama.cpp" in output


def test_push_help_explains_the_options() -> None:
    result = runner.invoke(app, ["artifacts", "push", "--help"])
    assert result.exit_code == 0
    for option in ("--name", "--pipeline", "--deploy", "--url", "--key"):
        assert option in result.output
