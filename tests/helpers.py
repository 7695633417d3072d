"""Small helpers shared by tests: accounts, keys, artifacts created the way a client would."""

from __future__ import annotations

import ast
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from modelhost.container import Services
from modelhost.store.models import ModelArtifact
from modelhost.store.types import new_id

ADMIN_KEY = "mh-admin-test-key-0123456789abcdef"
SOURCE = Path(__file__).resolve().parents[1] / "src" / "modelhost"


def source_trees() -> list[tuple[Path, ast.Module]]:
    """Every module of `src/modelhost` (its path under it) and its syntax tree, for the tests that read
    the code itself. CPython 3.11 keeps the AST converter's recursion depth in state shared by every
    thread (gh-106905), so a parse that overlaps one in another thread of the test's process (a library's
    background thread) raises `SystemError: AST constructor recursion depth mismatch`: parsed again."""
    trees = []
    for path in sorted(SOURCE.rglob("*.py")):
        source = path.read_text()
        for attempt in range(3):
            try:
                trees.append((path.relative_to(SOURCE), ast.parse(source, str(path))))
                break
            except SystemError:
                if attempt == 2:
                    raise
    return trees


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def deployment_metric(http: httpx.Client, name: str, deployment_id: str, missing: float = 0.0) -> float:
    """A deployment's sample of metric `name` in the server's `/metrics` (`missing` where there is none)."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(f"{name}{{") and f'deployment="{deployment_id}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return missing


def busiest_replica(exposition: str, name: str, deployment_id: str, missing: float = -1.0) -> float:
    """The largest of a per-replica gauge's series (`pid`-labelled) for a deployment in a `/metrics`
    text, as a dashboard's `max by (deployment)` reads it: a replica replaced earlier may still show a
    series of its own."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line.startswith(f"{name}{{") and f'deployment="{deployment_id}"' in line
    ]
    return max(values, default=missing)


def read_while_generating(
    read: Callable[[], float], generate: Callable[[], object], timeout: float = 30
) -> float:
    """`read()` (a gauge) once it is above 0 while `generate()` runs again and again on a thread (each
    call holding the engine a while), or its last value after `timeout`. One generation alone may end
    before a scrape, slow under a full suite's load, reads it; the thread's last call is waited for."""
    stop = threading.Event()

    def keep_generating() -> None:
        while not stop.is_set():
            generate()

    generating = threading.Thread(target=keep_generating)
    generating.start()
    try:
        deadline = time.monotonic() + timeout
        while (value := read()) <= 0 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        generating.join()
    return value


async def new_account(
    client: httpx.AsyncClient, name: str = "acme", credits: float = 100.0
) -> dict[str, Any]:
    response = await client.post(
        "/v1/admin/accounts", json={"name": name, "credits": credits}, headers=bearer(ADMIN_KEY)
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def ready_artifact(services: Services, account_id: str, pipeline: str = "feature-extraction") -> str:
    """A `ready` artifact row made through the store (the artifact routes arrive with issue 3)."""
    with services.database.transaction() as session:
        artifact = ModelArtifact(
            id=new_id("art"), account_id=account_id, display_name="tiny", pipeline=pipeline, status="ready"
        )
        session.add(artifact)
        return artifact.id


async def new_deployment(
    client: httpx.AsyncClient,
    services: Services,
    account: dict[str, Any],
    model: str,
    pipeline: str = "feature-extraction",
    **extra: Any,
) -> dict[str, Any]:
    artifact_id = ready_artifact(services, account["id"], pipeline)
    response = await client.post(
        "/v1/deployments",
        json={"model": model, "artifact_id": artifact_id, **extra},
        headers=bearer(account["api_key"]),
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def assert_error(
    response: httpx.Response,
    status: int,
    code: str | None = None,
    type_: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    """The one error body, with the expected status (and code / type / param when given)."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "code", "param"}, error
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code, error
    if type_ is not None:
        assert error["type"] == type_, error
    if param is not None:
        assert error["param"] == param, error
    return error


async def push_folder(
    client: httpx.AsyncClient, key: str, folder: Any, pipeline: str, name: str = "model"
) -> dict[str, Any]:
    """The whole upload protocol over HTTP: create, start, PUT every file, complete. Returns §4.14's body."""
    from pathlib import Path

    headers = bearer(key)
    artifact = (
        await client.post(
            "/v1/model-artifacts", json={"display_name": name, "pipeline": pipeline}, headers=headers
        )
    ).json()
    started = await client.post(f"/v1/model-artifacts/{artifact['id']}/uploads", headers=headers)
    assert started.status_code == 201, started.text
    base = f"/v1/model-artifacts/{artifact['id']}/uploads/{started.json()['upload_id']}"
    root = Path(folder)
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        put = await client.put(
            f"{base}/files/{file.relative_to(root).as_posix()}", content=file.read_bytes(), headers=headers
        )
        assert put.status_code == 200, put.text
    completed = await client.post(f"{base}/complete", headers=headers)
    assert completed.status_code == 200, completed.text
    body: dict[str, Any] = completed.json()
    return body


def push_folder_sync(http: Any, key: str, folder: Any, pipeline: str) -> str:
    """Upload a folder through the real protocol with a sync client; returns the ready artifact's id."""
    from pathlib import Path

    headers = bearer(key)
    art = http.post(
        "/v1/model-artifacts", json={"display_name": Path(folder).name, "pipeline": pipeline}, headers=headers
    )
    upload_id = http.post(f"/v1/model-artifacts/{art.json()['id']}/uploads", headers=headers).json()[
        "upload_id"
    ]
    base = f"/v1/model-artifacts/{art.json()['id']}/uploads/{upload_id}"
    for file in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        assert (
            http.put(
                f"{base}/files/{file.relative_to(Path(folder)).as_posix()}",
                content=file.read_bytes(),
                headers=headers,
            ).status_code
            == 200
        )
    done = http.post(f"{base}/complete", headers=headers, timeout=120).json()
    assert done["artifact"]["status"] == "ready", done
    artifact_id: str = done["artifact"]["id"]
    return artifact_id


class ManualClock:
    """A `modelhost.clock.Clock` that moves only when told: billing and idle windows without waiting."""

    def __init__(self, now_ms: int) -> None:
        self.ms = now_ms

    def now_ms(self) -> int:
        return self.ms

    def monotonic(self) -> float:
        return self.ms / 1000

    def advance(self, seconds: float) -> None:
        self.ms += round(seconds * 1000)


@dataclass
class Gateway:
    """A live gateway seen by one account: deploys tiny models once each and calls task endpoints."""

    http: httpx.Client
    key: str
    recipes: Path
    media_root: Path | None = None  # where the gateway reads local media paths from, if anywhere
    files_url: str = ""  # a local HTTP server's URL for media inputs, if any
    deployed: dict[str, str] = field(default_factory=dict)

    def deploy(self, recipe: str, sub: str, pipeline: str, model: str | None = None) -> str:
        """Push a recipe model and deploy it (cold: it loads on the first request) as `model` (default
        from the recipe's name). Returns the model ID."""
        model = model or f"{recipe[:3]}-{sub or 'main'}".replace("_", "-")
        if model not in self.deployed:
            artifact_id = push_folder_sync(self.http, self.key, self.recipes / recipe / sub, pipeline)
            created = self.http.post(
                "/v1/deployments",
                json={"model": model, "artifact_id": artifact_id, "readiness": "cold"},
                headers=bearer(self.key),
            )
            assert created.status_code == 201, created.text
            self.deployed[model] = created.json()["id"]
        return model

    def call(self, path: str, **body: Any) -> httpx.Response:
        return self.http.post(path, json=body, headers=bearer(self.key), timeout=120)

    def ok(self, path: str, **body: Any) -> Any:
        response = self.call(path, **body)
        assert response.status_code == 200, response.text
        return response.json()


def deploy_folder_sync(
    http: Any, key: str, folder: Any, pipeline: str, model: str, **body: Any
) -> dict[str, Any]:
    """Upload a folder (`push_folder_sync`) and deploy it as `model`, `body` adding to the deployment
    (`readiness`, `engine`, ...); the deployment as created."""
    artifact = push_folder_sync(http, key, folder, pipeline)
    created = http.post(
        "/v1/deployments", json={"model": model, "artifact_id": artifact, **body}, headers=bearer(key)
    )
    assert created.status_code == 201, created.text
    deployment: dict[str, Any] = created.json()
    return deployment


def runner_lines(data: bytes) -> list[Any]:
    """A batch input file's lines as the batch runner reads them (`batches.reader`): each a `Line` or the
    `LineError` that says why it is not one."""
    import io

    from modelhost.batches.input import parse_line
    from modelhost.batches.reader import lines_of

    return [parse_line(number, raw) for number, _, raw in lines_of(io.BytesIO(data))]


def read_stream_killing(
    chunks: Iterable[Any], kill_after: int | None, replica: Callable[[], int]
) -> tuple[str, int, bool]:
    """An openai SDK stream (chat or completions chunks) read to its end: its text and completion tokens,
    the `replica()` process SIGKILLed once `kill_after` chunks of text have arrived (issue 73's kill
    tests), and whether that was before the answer ended."""
    parts: list[str] = []
    tokens, killed = 0, False
    for chunk in chunks:
        for choice in chunk.choices:
            delta = getattr(choice, "delta", None)
            text = delta.content if delta is not None else getattr(choice, "text", None)
            if text:
                parts.append(text)
        tokens = chunk.usage.completion_tokens if chunk.usage else tokens
        if kill_after is not None and not killed and len(parts) >= kill_after:
            os.kill(replica(), signal.SIGKILL)
            killed = True
    return "".join(parts), tokens, killed
