"""Open WebUI, the most used chat front end for OpenAI-compatible servers, against a live modelhost
(issue 59): it lists the models and chats through its own API (`GET /api/models`, `POST
/api/chat/completions`), as its browser front end does. Run by `make test-clients`, from its own
environment `.venv-openwebui` (scripts/setup-openwebui.sh: about 2.4 GB, once); skipped where that is
not made. Open WebUI reads fields of `/v1/models` entries as its own (a `pipeline` there was a 500 on
its model list and a 404 on every chat), so this is what keeps our extensions out of its way.

Open WebUI runs as its own process, offline (`OFFLINE_MODE`, no Ollama), without sign-in
(`WEBUI_AUTH=False`: its one user is the admin) and with its data in the test's folder.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.chat_model import ChatServer, served_chat_model
from tests.helpers import bearer
from tests.server_process import free_port

OPENWEBUI = Path(__file__).resolve().parent.parent / ".venv-openwebui"
MARKER = OPENWEBUI / ".modelhost-openwebui"  # written by scripts/setup-openwebui.sh once it imports
STARTUP_SECONDS = 300  # its first start runs its migrations and imports torch: 100 s on 2 busy cores

pytestmark = [
    pytest.mark.clients,
    pytest.mark.skipif(
        not MARKER.exists(),
        reason="Open WebUI's environment .venv-openwebui is not made: `make test-clients` makes it "
        "(scripts/setup-openwebui.sh, about 2.4 GB once) and runs this test",
    ),
]
MESSAGES = [{"role": "user", "content": "what is the weather in berlin?"}]


@pytest.fixture(scope="module")
def modelhost(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[ChatServer]:
    with served_chat_model(tmp_path_factory.mktemp("modelhost"), recipes) as server:
        yield server


@pytest.fixture(scope="module")
def webui(modelhost: ChatServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """Open WebUI's server with modelhost as its one OpenAI connection; a client signed in as its user."""
    data = tmp_path_factory.mktemp("openwebui")
    port = free_port()
    env = {
        **os.environ,
        "DATA_DIR": str(data),
        "OPENAI_API_BASE_URL": f"{modelhost.url}/v1",
        "OPENAI_API_KEY": modelhost.key,
        "WEBUI_AUTH": "False",
        "WEBUI_SECRET_KEY": "modelhost-test",
        "ENABLE_OLLAMA_API": "False",
        "OFFLINE_MODE": "True",
        "HF_HUB_OFFLINE": "1",
        "RAG_EMBEDDING_ENGINE": "openai",  # no local embedding model to load (there is none offline)
        "ANONYMIZED_TELEMETRY": "False",
        "DO_NOT_TRACK": "True",
        "SCARF_NO_ANALYTICS": "True",
        "PYTHONPATH": "",  # its own packages only, not our checkout's
    }
    log = (data / "openwebui.log").open("wb")
    command = [str(OPENWEBUI / "bin" / "open-webui"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(command, env=env, cwd=data, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(url, process, data / "openwebui.log")
        client = httpx.Client(base_url=url, timeout=120)
        signed_in = client.post("/api/v1/auths/signin", json={"email": "", "password": ""})
        assert signed_in.status_code == 200, signed_in.text
        client.headers["Authorization"] = f"Bearer {signed_in.json()['token']}"
        yield client
        client.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_until_up(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"Open WebUI exited with {process.returncode}:\n{_tail(log)}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"Open WebUI did not answer /health within {STARTUP_SECONDS} s:\n{_tail(log)}")


def _tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-40:])


def test_open_webui_lists_the_modelhost_model(webui: httpx.Client, modelhost: ChatServer) -> None:
    listed = webui.get("/api/models")
    assert listed.status_code == 200, listed.text  # a 500 while `pipeline` was ours (issue 59)
    models = {m["id"]: m for m in listed.json()["data"]}
    assert "chat" in models, sorted(models)
    assert models["chat"]["owned_by"] == "openai"  # Open WebUI's word for an OpenAI connection's model


def test_open_webui_chats_with_the_modelhost_model(webui: httpx.Client, modelhost: ChatServer) -> None:
    """Its answer is the model's own: greedy, the same as modelhost answers the same chat directly."""
    params: dict[str, Any] = {"temperature": 0, "max_tokens": 8}
    webui.get("/api/models")  # Open WebUI resolves a chat's model from the list it last fetched
    answered = webui.post(
        "/api/chat/completions", json={"model": "chat", "messages": MESSAGES, "stream": False, **params}
    )
    assert answered.status_code == 200, answered.text  # a 404 (`/v1/chat/filter/inlet`) before
    direct = modelhost.http.post(
        "/v1/chat/completions",
        json={"model": "chat", "messages": MESSAGES, **params},
        headers=bearer(modelhost.key),
    )
    expected = direct.json()["choices"][0]["message"]["content"]
    assert expected and answered.json()["choices"][0]["message"]["content"] == expected
